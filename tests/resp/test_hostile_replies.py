"""A server is not trusted: malformed, oversized or lying replies, sans-I/O and fuzzed.

Every malformed reply raises ProtocolError (the connection is then dropped), never another
exception; nothing a server declares allocates memory it has not sent; a reply is held to
what its command can legitimately return.
"""

from __future__ import annotations

import random
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmcache_valkey.errors import ProtocolError, Redirect, ServerError
from lmcache_valkey.transport.resp.parser import (
    MAX_DEPTH,
    MAX_LINE,
    SMALL_REPLY_MAX,
    ReplyParser,
    SimpleString,
)

MiB = 1 << 20


def parse(data: bytes, *, sink=None, bound: int = SMALL_REPLY_MAX, splits: int = 0) -> list:
    out: list = []
    p = ReplyParser(out.append)
    p.push_sink(sink, bound)
    rng = random.Random(splits)
    i = 0
    while i < len(data):
        n = rng.choice([1, 2, 3, 5, 64, 4096, 70_000]) if splits else len(data)
        p.feed(data[i:i + n])
        i += n
    return out


MALFORMED = {
    "nil bulk other than -1": b"$-2\r\n",
    "nil array other than -1": b"*-5\r\n",
    "integer with a plus sign": b":+1\r\n",
    "integer with a space": b": 1\r\n",
    "integer with an underscore": b":1_000\r\n",
    "empty integer": b":\r\n",
    "integer of 30 digits": b":" + b"9" * 30 + b"\r\n",
    "bulk length with an underscore": b"$1_0\r\n0123456789\r\n",
    "bulk length of 30 digits": b"$" + b"9" * 30 + b"\r\n",
    "array nested 200000 deep": b"*1\r\n" * 200_000 + b":1\r\n",
    "array nested one level too deep": b"*1\r\n" * (MAX_DEPTH + 1) + b":1\r\n",
    "line longer than MAX_LINE": b"+" + b"x" * (MAX_LINE + 10),
    "RESP3 push": b">2\r\n+a\r\n+b\r\n",
    "RESP3 null": b"_\r\n",
    "unknown type byte": b"\x00\xff\r\n",
    "bulk without its CRLF": b"$3\r\nabcXY",
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
@pytest.mark.parametrize("splits", [0, 7])
def test_malformed_replies_are_protocol_errors(data: bytes, splits: int) -> None:
    with pytest.raises(ProtocolError):
        parse(data, bound=1 << 30, splits=splits)


OVER_BOUND = {
    "a bulk declared past the bound": b"$1500000000\r\n",
    "an array whose element is a bulk declared past the bound": b"*1\r\n$1500000000\r\n",
    "an array declaring more elements than the bound holds": b"*1000000000\r\n",
    "a status past the bound": b"+" + b"x" * (SMALL_REPLY_MAX + 1) + b"\r\n",
    "an error past the bound": b"-ERR " + b"x" * SMALL_REPLY_MAX + b"\r\n",
}


@pytest.mark.parametrize("data", OVER_BOUND.values(), ids=OVER_BOUND.keys())
def test_a_reply_larger_than_its_command_can_return_is_refused_before_any_allocation(data: bytes) -> None:
    """EXISTS can only answer an integer: a 1.5 GB bulk in its place is refused from its header."""
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="bound"):
            parse(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 * MiB


def test_a_declared_length_allocates_only_what_arrives() -> None:
    """Within its bound a big sink-less bulk grows as bytes come, never from the header's number."""
    out: list = []
    p = ReplyParser(out.append)
    p.push_sink(None, 2_000_000_000)
    tracemalloc.start()
    try:
        p.feed(b"$1500000000\r\n" + b"x" * 300_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB and out == []


@pytest.mark.parametrize("size", [0, 1, 65_535, 65_536, 65_537, 200_000, 3 * MiB + 17])
@pytest.mark.parametrize("seed", range(3))
def test_a_growing_bulk_arrives_whole_in_any_chunking(size: int, seed: int) -> None:
    value = random.Random(seed).randbytes(size)
    wire = b"+before\r\n" + b"$%d\r\n%s\r\n" % (size, value) + b":7\r\n"
    out: list = []
    p = ReplyParser(out.append)
    p.push_sink(None)
    p.push_sink(None, 4 * MiB)
    p.push_sink(None)
    rng = random.Random(seed)
    mv = memoryview(wire)
    while len(mv):  # as a BufferedProtocol receives: into whatever get_buffer hands out
        dst = p.get_buffer(-1)
        n = min(len(dst), len(mv), rng.choice([1, 3, 100, 5000, 1 << 20]))
        dst[:n] = mv[:n]
        mv = mv[n:]
        p.buffer_updated(n)
    assert out == [b"before", value, 7] and type(out[1]) is bytes


def test_a_status_is_told_apart_from_a_bulk_with_the_same_bytes() -> None:
    status, bulk = parse(b"+OK\r\n")[0], parse(b"$2\r\nOK\r\n")[0]
    assert status == bulk == b"OK"
    assert type(status) is SimpleString and type(bulk) is bytes


@pytest.mark.parametrize("reply", [b":5\r\n", b"*1\r\n$3\r\nabc\r\n", b"+OK\r\n", b"*-1\r\n"])
def test_where_a_get_waits_for_a_bulk_anything_else_is_a_protocol_error(reply: bytes) -> None:
    buf = bytearray(b"\xee" * 16)
    with pytest.raises(ProtocolError, match="expected a bulk"):
        parse(reply, sink=[memoryview(buf)])
    assert buf == b"\xee" * 16


def test_an_integer_run_stops_at_a_reply_that_waits_for_a_bulk() -> None:
    out: list = []
    p = ReplyParser(out.append)
    p.push_no_sinks(2)
    p.push_sink([memoryview(bytearray(8))])
    with pytest.raises(ProtocolError, match="expected a bulk"):
        p.feed(b":1\r\n:0\r\n:1\r\n")
    assert out == [1, 0]


@pytest.mark.parametrize("message,kind,slot,host,port", [
    (b"MOVED 3999 127.0.0.1:6381", "MOVED", 3999, "127.0.0.1", 6381),
    (b"ASK 0 ::1:7000", "ASK", 0, "::1", 7000),
    (b"MOVED 16383 :6380", "MOVED", 16383, "", 6380),
])
def test_a_redirection_is_parsed_once_when_read(message, kind, slot, host, port) -> None:
    (r,) = parse(b"-" + message + b"\r\n")
    assert isinstance(r, Redirect) and (r.kind, r.slot, r.host, r.port) == (kind, slot, host, port)


@pytest.mark.parametrize("message", [
    b"MOVED 99999 h:1", b"MOVED 16384 h:1", b"MOVED -1 h:1", b"MOVED 12 h:0", b"MOVED 12 h:65536",
    b"MOVED 12 h", b"MOVED 12", b"ASK x h:1", b"MOVED 12 h:+1", b"MOVED 12 " + b"h" * 300 + b":1",
    b"MOVED 12 h\x01:1",
])
def test_a_malformed_redirection_is_a_protocol_error_value(message: bytes) -> None:
    """Delivered as a value like any error reply (one bad element of a pipeline hides no other)."""
    out = parse(b"*2\r\n-" + message + b"\r\n:1\r\n", bound=1 << 20)
    assert isinstance(out[0][0], ProtocolError) and not isinstance(out[0][0], ServerError) and out[0][1] == 1


# --- fuzzing ---------------------------------------------------------------------------

VALID = [
    b"+OK\r\n", b"-ERR boom\r\n", b":0\r\n", b":1\r\n", b":-7\r\n", b"$-1\r\n", b"*-1\r\n", b"*0\r\n",
    b"$5\r\nhello\r\n", b"$0\r\n\r\n", b"*2\r\n$1\r\na\r\n:2\r\n", b"*1\r\n*1\r\n*1\r\n:3\r\n",
    b"-MOVED 12 127.0.0.1:7000\r\n", b"$70000\r\n" + b"z" * 70_000 + b"\r\n",
]


def _feed_all(p: ReplyParser, data: bytes, sizes: list[int]) -> None:
    mv, k = memoryview(data), 0
    while len(mv):
        dst = p.get_buffer(-1)
        n = max(1, min(len(dst), len(mv), sizes[k % len(sizes)] if sizes else len(mv)))
        k += 1
        dst[:n] = mv[:n]
        mv = mv[n:]
        p.buffer_updated(n)


def _check_one(data: bytes, sizes: list[int], bound: int, sink_caps: list[int] | None) -> None:
    """Either values come out, or ProtocolError: no other exception, no write past a sink,
    no sink-less value larger than the reply's bound."""
    out: list = []
    p = ReplyParser(out.append)
    guards = []
    sinks = []
    for _ in range(64):
        if sink_caps is not None:
            bufs = [bytearray(c + 8) for c in sink_caps]
            guards.append(bufs)
            sinks.append([memoryview(b)[:c] for b, c in zip(bufs, sink_caps)])
            p.push_sink(sinks[-1], bound)
        else:
            p.push_sink(None, bound)
    try:
        _feed_all(p, data, sizes)
    except ProtocolError:
        pass
    for bufs in guards:
        assert all(b[-8:] == bytes(8) for b in bufs)  # nothing written past a sink buffer

    def size(v) -> int:
        if isinstance(v, (bytes, bytearray)):
            return len(v)
        if isinstance(v, list):
            return sum(size(x) for x in v)
        return 0

    assert all(size(v) <= bound for v in out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.binary(max_size=400),
    sizes=st.lists(st.integers(1, 64), max_size=8),
    bound=st.sampled_from([16, SMALL_REPLY_MAX, 1 << 20]),
    sink_caps=st.one_of(st.none(), st.lists(st.integers(0, 40), min_size=1, max_size=3)),
)
def test_fuzz_random_bytes(data, sizes, bound, sink_caps) -> None:
    _check_one(data, sizes, bound, sink_caps)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.sampled_from(VALID), min_size=1, max_size=6),
    edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.sampled_from(["flip", "cut", "dup", "digit"]),
                             st.integers(0, 255)), max_size=4),
    sizes=st.lists(st.integers(1, 9000), max_size=8),
    bound=st.sampled_from([SMALL_REPLY_MAX, 1 << 20]),
    sink_caps=st.one_of(st.none(), st.lists(st.integers(0, 80_000), min_size=1, max_size=3)),
)
def test_fuzz_mutated_valid_streams(parts, edits, sizes, bound, sink_caps) -> None:
    data = bytearray(b"".join(parts))
    for pos, how, byte in edits:
        if not data:
            break
        i = pos % len(data)
        if how == "flip":
            data[i] = byte
        elif how == "cut":
            del data[i:i + byte % 16 + 1]
        elif how == "dup":
            data[i:i] = data[i:i + byte % 16 + 1]
        else:
            data[i:i] = b"9" * (byte % 24)
    _check_one(bytes(data), sizes, bound, sink_caps)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.sampled_from(VALID + [b":0\r\n", b":1\r\n"] * 6), min_size=1, max_size=40),
    edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=3),
    sizes=st.lists(st.integers(1, 64), max_size=8),
    runs=st.lists(st.integers(1, 20), min_size=1, max_size=4),
)
def test_fuzz_flag_runs(parts, edits, sizes, runs) -> None:
    """Pipelined EXISTS replies read as flag runs: values or ProtocolError, nothing else; a
    run delivers exactly as many flags as it expected, and anything but :0/:1 is set aside."""
    data = bytearray(b"".join(parts))
    for pos, byte in edits:
        if data:
            data[pos % len(data)] = byte
    out: list = []
    p = ReplyParser(out.append)
    for n in runs:
        p.push_flags(n)
    try:
        _feed_all(p, bytes(data), sizes)
    except ProtocolError:
        pass
    for run, n in zip(out, runs):
        assert len(run.flags) == n and set(run.flags) <= {0, 1}
        assert all(run.flags[i] == 0 for i in run.odd)
