"""A tenant allowed RESTORE or the module's commands cannot crash the server: malformed
values are refused ("Bad data format"), hostile arguments get error replies, expiry
arguments are checked as the core SET checks them, and the RDB/AOF load paths refuse what
they cannot load instead of panicking. Every case ends with the server answering PING."""

from __future__ import annotations

import random
import shutil
import time

import pytest
import valkey

from lmcache_valkey.codec import crc32c
from lmcache_valkey.transport.fabric import FabricEndpoint, commands
from support.fabric_peer import proven_hello

import dumphelp as d

SERVERS = {"valkey-9.1.2": None, "valkey-8.0": "/usr/bin/valkey-server", "redis-7.0": "/usr/bin/redis-server"}
LLONG_MAX = (1 << 63) - 1


def _binary(name: str) -> str | None:
    path = SERVERS[name]
    if path is not None and not shutil.which(path):
        pytest.skip(f"{path} not installed (scripts/setup.sh installs it)")
    return path


def _restore(c: valkey.Valkey, payload: bytes) -> object:
    try:
        return c.restore("crafted", 0, payload, replace=True) in (True, b"OK")
    except valkey.ResponseError as exc:
        return exc


def _consistent_or_absent(c: valkey.Valkey, key: str) -> None:
    """A value that did load is whole: its stored length and CRC describe its bytes."""
    info = commands.parse_info_reply(c.execute_command(commands.INFO, key))
    if info is None:
        return
    value = c.execute_command(commands.TCP_GET, key)
    assert info == (len(value), crc32c(value))


def _crafted_payloads(dump: d.ModuleDump, value: bytes) -> dict[str, bytes]:
    crc = crc32c(value)
    good = [d.uint_field(len(value)), d.uint_field(crc), d.string_field(value)]
    out = {}
    # The string opcode changed into every other opcode (the reported crash), in each field.
    for pos in range(3):
        for op in (d.OP_EOF, d.OP_SINT, d.OP_UINT, d.OP_FLOAT, d.OP_DOUBLE, d.OP_STRING, 6, 63):
            if op == good[pos][0]:
                continue
            fields = list(good)
            fields[pos] = (op, fields[pos][1])
            out[f"field{pos}-opcode{op}"] = dump.build(fields)
    out.update({
        "length-mismatch": dump.build([d.uint_field(len(value) + 1), d.uint_field(crc), d.string_field(value)]),
        "crc-mismatch": dump.build([d.uint_field(len(value)), d.uint_field(crc ^ 1), d.string_field(value)]),
        "crc-wider-than-32-bits": dump.build([d.uint_field(len(value)), d.uint_field(crc | 1 << 40), d.string_field(value)]),
        "huge-length": dump.build([d.uint_field(1 << 62), d.uint_field(crc), d.string_field(value)]),
        "string-longer-than-payload": dump.build([d.uint_field(len(value)), d.uint_field(crc),
                                                  (d.OP_STRING, d.length(len(value) + 1000) + value)]),
        "no-fields": dump.build([]),
        "missing-string": dump.build(good[:2]),
        "no-eof": dump.build(good, eof=False),
        "unknown-encoding-version": dump.build(good, encver=9),
        "encoding-1-with-extra-fields": dump.build(good, encver=1),
        "truncated": d.seal(dump.build(good)[:-14], dump.rdb_version),
    })
    return out


@pytest.mark.parametrize("name", list(SERVERS))
def test_crafted_restore_payloads_are_refused_and_the_server_stays_up(start_server, name):
    srv = start_server("none", binary=_binary(name), arena_mb=8)
    c = srv.client()
    value = b"a chunk header and its payload" * 10
    c.execute_command(commands.TCP_SET, "orig", value)
    dump = d.ModuleDump.parse(c.dump("orig"))
    for label, payload in _crafted_payloads(dump, value).items():
        reply = _restore(c, payload)
        assert isinstance(reply, valkey.ResponseError), (label, reply)
        assert "Bad data format" in str(reply), (label, reply)
        assert c.ping(), label
        assert c.exists("crafted") == 0, label
    # The genuine payload, and the earlier encoding (bytes only), still load whole.
    assert _restore(c, c.dump("orig")) is True
    old = dump.build([d.string_field(value)], encver=1)
    assert _restore(c, old) is True and c.execute_command(commands.TCP_GET, "crafted") == value
    _consistent_or_absent(c, "crafted")
    assert srv.info()["objects"] == 2


def test_random_corruptions_of_a_dump_never_crash_the_server(start_server):
    srv = start_server("none", arena_mb=8)
    c = srv.client()
    c.execute_command(commands.TCP_SET, "orig", bytes(range(256)) * 4)
    dump = c.dump("orig")
    body, version = dump[:-10], dump[-10:-8]
    rng = random.Random(8)
    outcomes = {"refused": 0, "loaded": 0}
    for _ in range(400):
        m = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(1, len(m))  # keep the type byte: other types are not ours
            kind = rng.random()
            if kind < 0.6:
                m[i] = rng.randrange(256)
            elif kind < 0.8:
                del m[i : i + rng.randint(1, 8)]
            else:
                m[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        reply = _restore(c, d.seal(bytes(m), version))
        outcomes["refused" if isinstance(reply, Exception) else "loaded"] += 1
        _consistent_or_absent(c, "crafted")
    assert c.ping()
    assert outcomes["refused"] > 300, outcomes


@pytest.mark.parametrize("px", [str(LLONG_MAX), str(LLONG_MAX - 1000), str(1 << 63), str((1 << 64) - 1), "0", "-5"])
def test_expiry_that_would_overflow_is_refused_like_the_core_set(start_server, px):
    srv = start_server("none", arena_mb=8)
    c = srv.client()
    with pytest.raises(valkey.ResponseError):
        c.execute_command(commands.TCP_SET, "k", b"v", commands.OPT_PX, px)
    assert c.exists("k") == 0
    # The expiry pass runs every 100 ms: a stored absolute time that overflowed aborts it.
    for _ in range(6):
        time.sleep(0.1)
        assert c.ping()
    # A large but valid expiry is kept, as by SET.
    c.execute_command(commands.TCP_SET, "k", b"v", commands.OPT_PX, str(LLONG_MAX // 2))
    assert c.pttl("k") > 0 and c.ping()


HOSTILE = ["", "0", "1", "-1", "abc", "PX", "TIMEOUT", "PARTIAL", "\x00", " 7", "+7", "1e3", "4096",
           str(LLONG_MAX), str(1 << 63), str(1 << 64), "9" * 40, "ff" * 20]


def _argument_variants() -> list[list[str]]:
    """Each command with each hostile value in each argument position (and longer tails)."""
    shapes = {
        commands.TCP_SET: [["k", "v"], ["k", "v", "PX", "100"]],
        commands.RDMA_SET: [["k", "4096", "1", "0", "4096", "TIMEOUT", "50"],
                            ["k", "4096", "CRC", "7", "1", "0", "4096", "PX", "100"]],
        commands.TCP_GET: [["k"]],
        commands.RDMA_GET: [["k", "1", "0", "4096", "TIMEOUT", "50", "PARTIAL"]],
        commands.INFO: [["k"], ["k", "LEN"]],
        commands.HELLO: [["00"], ["00", "PROOF", "REGION", "1", "0", "4096"]],
        commands.PROVE: [["1", "0"]],
        "BLOB.SET": [["k", "v", "PX", "100"], ["k", "4096", "1", "0", "4096", "TIMEOUT", "50"]],
        "BLOB.GET": [["k"], ["k", "1", "0", "4096", "TIMEOUT", "50", "PARTIAL"]],
        "BLOB.HELLO": [["00"]],
    }
    out = []
    for cmd, forms in shapes.items():
        out.append([cmd])
        for form in forms:
            for pos in range(len(form)):
                for bad in HOSTILE:
                    out.append([cmd, *form[:pos], bad, *form[pos + 1 :]])
            out.append([cmd, *form, "1", "2"])
            out.append([cmd, *form, *(["1"] * 300)])
    return out


@pytest.mark.parametrize("with_session", [False, True])
def test_hostile_arguments_to_every_command_get_replies_not_crashes(start_server, with_session):
    srv = start_server("tcp;ofi_rxm", arena_mb=8)
    c = valkey.Valkey(port=srv.port, single_connection_client=True, socket_timeout=10)
    c.execute_command(commands.TCP_SET, "k", b"x" * 4096)
    ep = FabricEndpoint("tcp;ofi_rxm") if with_session else None
    try:
        if ep is not None:
            buf = bytearray(4096)
            proven_hello(c, ep, ep.register_buffer(buf), buf)
        for args in _argument_variants():
            try:
                c.execute_command(*args)
            except valkey.ResponseError:
                pass
            assert c.ping(), args
    finally:
        if ep is not None:
            c.close()
            ep.close()
    assert srv.client().ping()


def test_hello_refuses_addresses_that_are_not_the_providers_form(start_server):
    srv = start_server("tcp;ofi_rxm", arena_mb=8)
    ep = FabricEndpoint("tcp;ofi_rxm")
    try:
        good = ep.name
        bad = {
            "too short": good[:-1],
            "too long": good + b"\x00",
            "other family": bytes([0xFF, 0xFF]) + good[2:],
            "empty": b"",
        }
        # (with PROOF, which the server requires: the address is what it refuses)
        for label, addr in bad.items():
            c = srv.client()
            with pytest.raises(valkey.ResponseError):
                c.execute_command(*commands.hello(addr, True))
            c.close()
        c = srv.client()
        assert c.execute_command(*commands.hello(good, True))
        c.close()
    finally:
        ep.close()


def test_transfers_are_refused_inside_transactions_and_scripts(start_server):
    srv = start_server("tcp;ofi_rxm", arena_mb=8)
    c = valkey.Valkey(port=srv.port, single_connection_client=True, socket_timeout=10)
    c.execute_command(commands.TCP_SET, "k", b"x" * 4096)
    with FabricEndpoint("tcp;ofi_rxm") as ep:
        buf = bytearray(4096)
        region = ep.register_buffer(buf)
        proven_hello(c, ep, region, buf)
        triple = [region.key, region.remote_addr(region.addr), 4096]
        pipe = c.pipeline(transaction=True)
        pipe.execute_command(commands.RDMA_GET, "k", *triple)
        with pytest.raises(valkey.ResponseError, match="can block"):
            pipe.execute()
        script = "return redis.call(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])"
        with pytest.raises(valkey.ResponseError, match="can block"):
            c.eval(script, 2, commands.RDMA_GET, "k", *triple)
        assert c.ping()
        c.close()


def test_blob_values_survive_an_rdb_and_an_aof_rewrite_and_reload(start_server, tmp_path):
    work = tmp_path / "data"
    work.mkdir()
    srv = start_server("none", arena_mb=8, extra=("--dir", str(work), "--appendonly", "yes",
                                                   "--appendfsync", "always"))
    c = srv.client()
    values = {f"k{i}": bytes([i]) * (1000 + i) for i in range(5)}
    for k, v in values.items():
        c.execute_command(commands.TCP_SET, k, v, commands.OPT_PX, "3600000")
    c.save()
    c.bgrewriteaof()
    _wait(lambda: c.info("persistence")["aof_rewrite_in_progress"] == 0)
    srv.stop()
    srv = start_server("none", arena_mb=8, extra=("--dir", str(work), "--appendonly", "yes"), port=srv.port)
    c = srv.client()
    for k, v in values.items():
        assert c.execute_command(commands.TCP_GET, k) == v
        assert 0 < c.pttl(k) <= 3600000
        _consistent_or_absent(c, k)


def test_an_aof_with_hostile_blob_commands_loads_and_the_server_stays_up(start_server, tmp_path):
    work = tmp_path / "data"
    work.mkdir()
    ep = FabricEndpoint("tcp;ofi_rxm")
    hostile = [
        [commands.TCP_SET, "overflow", "v", commands.OPT_PX, str(LLONG_MAX)],
        ["BLOB.SET", "garbage", "7", "1", "2", "3", "4"],
        [commands.HELLO, ep.name.hex()],  # the loader is no fabric peer
        [commands.RDMA_GET, "kept", "1", "0", "4096"],
        [commands.RDMA_SET, "rma", "4096", "1", "0", "4096"],
        ["BLOB.SET", "kept", "kept-value"],  # what an AOF of the previous release holds
    ]
    aof = b"".join(_resp(args) for args in hostile)
    (work / "appendonly.aof").write_bytes(aof)
    srv = start_server("tcp;ofi_rxm", arena_mb=8, extra=("--dir", str(work), "--appendonly", "yes",
                                                          "--appendfilename", "appendonly.aof"))
    ep.close()
    c = srv.client()
    for _ in range(5):
        time.sleep(0.1)
        assert c.ping()
    assert c.execute_command(commands.TCP_GET, "kept") == b"kept-value"
    assert c.exists("overflow", "garbage", "rma") == 0
    assert srv.info()["sessions"] == 0


def test_a_corrupt_rdb_file_fails_the_load_cleanly(start_server, tmp_path):
    """A damaged value in an RDB file stops the start-up with a logged load failure (exit
    code 1), not a crash report."""
    work = tmp_path / "data"
    work.mkdir()
    srv = start_server("none", arena_mb=8, extra=("--dir", str(work), "--dbfilename", "dump.rdb"))
    c = srv.client()
    value = random.Random(3).randbytes(3000)  # incompressible: stored as a plain string
    c.execute_command(commands.TCP_SET, "k", value)
    c.save()
    srv.stop()
    rdb = work / "dump.rdb"
    raw = bytearray(rdb.read_bytes())
    at = raw.index(value)
    raw[at - 3] = d.OP_DOUBLE  # the string field's opcode, just before its 2-byte length
    raw[-8:] = b"\x00" * 8  # a zero checksum is not checked on load
    rdb.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError) as exc:
        start_server("none", arena_mb=8, extra=("--dir", str(work), "--dbfilename", "dump.rdb"))
    log = str(exc.value)
    assert log.startswith("server exited (1)"), log  # a panic ends by a signal instead
    assert "module data for the module 'lmcvblob'" in log and "rdb file reading failure" in log, log


def _resp(args: list[str]) -> bytes:
    out = f"*{len(args)}\r\n".encode()
    for a in args:
        b = a.encode() if isinstance(a, str) else a
        out += f"${len(b)}\r\n".encode() + b + b"\r\n"
    return out


def _wait(pred, tries: int = 200) -> None:
    for _ in range(tries):
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")
