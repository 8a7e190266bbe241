"""The BLOB.* command dialect, client side: names and reply/error decoding in one place.

Mirrors endpoint/include/lmcv_commands.h and lmcv_replies.h (a test checks they agree).
The names follow valkey-large-object, whose names changed across versions; a deployment
against another spelling changes only this module (docs/fabric-command-dialect.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from lmcache_valkey.errors import FabricUnavailable, LmcacheValkeyError, ServerError, server_error

from .errors import NoFabricSession, OutsideRegions, PeerNotProven, ServerDeadline, TransferFailed, WindowTooSmall

HELLO = "BLOB.HELLO"
SET = "BLOB.SET"
GET = "BLOB.GET"
INFO = "BLOB.INFO"
PROVE = "BLOB.RDMA_PROVE"  # extension: completes HELLO ... PROOF
DELETE = "UNLINK"  # what the worker's ACL line already allows for its keys
ALL = (HELLO, SET, GET, INFO, PROVE)
ACL_CATEGORY = "largeobj"  # the module's ACL category (Valkey 9.1: +@largeobj)

OPT_PX = "PX"
OPT_TIMEOUT = "TIMEOUT"
OPT_PARTIAL = "PARTIAL"
OPT_PROOF = "PROOF"
OPT_REGION = "REGION"

NONCE_BYTES = 16
MAX_REGIONS = 32

MAX_TRIPLES = 64

Triple = tuple[int, int, int]  # (rkey, remote addr, length)


def hello(name: bytes, proof: bool = False, regions: Sequence[Triple] = ()) -> list[object]:
    """HELLO, with our extensions when asked: PROOF (the reply carries a nonce) and the
    REGIONs this session may use. A server without them refuses the extended form."""
    args: list[object] = [HELLO, name.hex()]
    if proof:
        args.append(OPT_PROOF)
    for r in regions:
        args += [OPT_REGION, *r]
    return args


def parse_hello_reply(reply: object, proof: bool) -> tuple[list[bytes], bytes | None]:
    """(server fabric addresses, nonce): plain ``[addr, ...]``, or with PROOF
    ``[[addr, ...], nonce]``."""
    def addresses(items: object) -> list[bytes]:
        if not isinstance(items, (list, tuple)):
            raise ServerError(f"unexpected {HELLO} reply: {reply!r}")
        return [bytes.fromhex(a.decode() if isinstance(a, bytes) else str(a)) for a in items]

    if not proof:
        return addresses(reply), None
    if not (isinstance(reply, (list, tuple)) and len(reply) == 2 and isinstance(reply[1], bytes)
            and len(reply[1]) == NONCE_BYTES):
        raise ServerError(f"unexpected {HELLO} PROOF reply: {reply!r}")
    return addresses(reply[0]), reply[1]


def prove(rkey: int, addr: int) -> list[object]:
    return [PROVE, rkey, addr]


def get_rma(key: bytes, triples: Sequence[Triple], timeout_ms: int, partial: bool) -> list[object]:
    args: list[object] = [GET, key]
    for t in triples:
        args.extend(t)
    args += [OPT_TIMEOUT, timeout_ms]
    if partial:
        args.append(OPT_PARTIAL)
    return args


def set_rma(key: bytes, total: int, triples: Sequence[Triple], ttl_ms: int | None, timeout_ms: int) -> list[object]:
    args: list[object] = [SET, key, total]
    for t in triples:
        args.extend(t)
    if ttl_ms:
        args += [OPT_PX, ttl_ms]
    args += [OPT_TIMEOUT, timeout_ms]
    return args


def get_bulk(key: bytes) -> list[object]:
    return [GET, key]


def set_bulk(key: bytes, value: bytes | memoryview, ttl_ms: int | None) -> list[object]:
    args: list[object] = [SET, key, value]
    if ttl_ms:
        args += [OPT_PX, ttl_ms]
    return args


def parse_get_reply(reply: object) -> tuple[int, int] | None:
    """``[obj_len, crc32c]`` -> (obj_len, crc); nil -> None (miss)."""
    if reply is None:
        return None
    if isinstance(reply, (list, tuple)) and len(reply) == 2:
        return int(reply[0]), int(reply[1])
    raise ServerError(f"unexpected {GET} reply: {reply!r}")


_INFLIGHT = re.compile(r"inflight=(\d+)")


def map_error(message: str) -> LmcacheValkeyError:
    """Typed exception for an error reply of the endpoint."""
    code = message.split(" ", 1)[0]
    if code == "NOHELLO":
        return NoFabricSession(message)
    if code == "NOPROOF":
        return PeerNotProven(message)
    if code == "BADREGION":
        return OutsideRegions(message)
    if code == "BADWINDOW":
        return WindowTooSmall(message)
    if code == "XFERFAILED":
        return TransferFailed(message)
    if code == "TIMEOUT":
        m = _INFLIGHT.search(message)
        return ServerDeadline(message, int(m.group(1)) if m else 1)
    if code == "NOFABRIC":
        return FabricUnavailable(message)
    return server_error(message)
