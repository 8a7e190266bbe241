"""The public surface of the RESP transport, pinned."""

from __future__ import annotations

import inspect
import os

import lmcache_valkey.transport.resp as resp
from lmcache_valkey.transport.resp import RespClient


def test_exports() -> None:
    assert resp.__all__ == ["RespClient"]


def test_signatures() -> None:
    expected = {
        "start": [],
        "get_into": ["key", "bufs", "*timeout"],
        "get_many_into": ["items", "*timeout"],
        "set": ["key", "parts", "*ttl_s", "*timeout"],
        "set_many": ["items", "*ttl_s", "*timeout"],
        "exists_many": ["keys", "*timeout", "*prefix"],
        "getrange_into": ["key", "start", "buf", "*timeout"],
        "delete": ["keys", "*timeout"],
        "command": ["args", "*key", "*timeout"],
        "command_all_primaries": ["args", "*timeout"],
        "scan_iter": ["match", "count"],
        "ping": ["*timeout"],
        "close": [],
    }
    for name, params in expected.items():
        sig = inspect.signature(getattr(RespClient, name))
        got = [("*" if p.kind is p.KEYWORD_ONLY else "") + p.name for p in list(sig.parameters.values())[1:]]
        assert got == params, name
        if name == "scan_iter":
            assert inspect.isasyncgenfunction(RespClient.scan_iter)
        else:
            assert inspect.iscoroutinefunction(getattr(RespClient, name)), name
    assert isinstance(RespClient.is_cluster, property)


def test_layering() -> None:
    """The transport imports only the standard library, config, errors, codec (checksums) and timeouts."""
    import ast
    import pathlib

    root = pathlib.Path(resp.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 3:
                assert node.module in ("config", "errors", "codec", "timeouts"), (path.name, node.module)
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not node.module.startswith(("valkey", "lmcache", "redis")), (path.name, node.module)
            if isinstance(node, ast.Import):
                for a in node.names:
                    assert not a.name.startswith(("valkey", "lmcache", "redis")), (path.name, a.name)


def test_set_sends_the_payload_in_place_and_the_chunk_header_with_the_command() -> None:
    """The payload goes out from the caller's buffer; the store's 512-byte chunk header (a
    bytearray) is copied into the command's bytes, so it is not a send of its own."""
    from lmcache_valkey.transport.resp.client import _set_parts

    header = bytearray(os.urandom(512))
    payload = bytearray(4 << 20)
    parts, total = _set_parts(b"key", [header, memoryview(payload)], 10.0)
    assert total == 512 + (4 << 20)
    command = b"*5\r\n$3\r\nSET\r\n$3\r\nkey\r\n$%d\r\n" % total
    assert type(parts[0]) is bytes and parts[0] == command + header
    assert isinstance(parts[1], memoryview) and parts[1].obj is payload  # not a copy
    assert parts[2:] == [b"\r\n$2\r\nPX\r\n$5\r\n10000\r\n"]
    # Only a bounded lead is copied: parts of 16 KiB (SGLang's layer slices) all stay in place.
    slices = [memoryview(payload)[at:at + (16 << 10)] for at in range(0, 1 << 20, 16 << 10)]
    parts, _ = _set_parts(b"key", [header, *slices], None)
    assert parts[0] == b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$%d\r\n" % (512 + (1 << 20)) + header
    assert all(p.obj is payload for p in parts[1:-1]) and len(parts) == 2 + len(slices)
    small, _ = _set_parts(b"k", [b"ab", b"cd"], None)  # tiny values: one buffer, one send
    assert small == [b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\nabcd\r\n"]
