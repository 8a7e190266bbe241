"""Sans-I/O parser tests: every reply type, fed in odd chunk sizes."""

from __future__ import annotations

import random

import pytest

from lmcache_valkey.errors import AuthError, OutOfMemory, ProtocolError, ServerError, server_error
from lmcache_valkey.transport.resp.parser import ReplyParser, encode_command

STREAM = (
    b"+OK\r\n"
    b"-ERR unknown command\r\n"
    b":42\r\n"
    b":-7\r\n"
    b"$5\r\nhello\r\n"
    b"$0\r\n\r\n"
    b"$-1\r\n"
    b"*-1\r\n"
    b"*0\r\n"
    b"*3\r\n$1\r\na\r\n*2\r\n:1\r\n-NOPERM no\r\n+x\r\n"
    b"-OOM command not allowed\r\n"
)
EXPECTED = [b"OK", ServerError, 42, -7, b"hello", b"", None, None, [], [b"a", [1, AuthError], b"x"], OutOfMemory]


def _check(out: list) -> None:
    assert len(out) == len(EXPECTED)
    for got, want in zip(out, EXPECTED):
        if isinstance(want, type):
            assert type(got) is want
        elif isinstance(want, list) and want and isinstance(want[1], list):
            assert got[0] == b"a" and got[1][0] == 1 and isinstance(got[1][1], AuthError) and got[2] == b"x"
        else:
            assert got == want


def _splits(data: bytes, rng: random.Random) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        n = rng.choice([1, 1, 2, 3, 7, 64, 1000, 70000])
        out.append(data[i:i + n])
        i += n
    return out


def test_one_byte_at_a_time() -> None:
    out: list = []
    p = ReplyParser(out.append)
    for b in STREAM:
        p.feed(bytes([b]))
    _check(out)


@pytest.mark.parametrize("seed", range(30))
def test_random_splits(seed: int) -> None:
    out: list = []
    p = ReplyParser(out.append)
    for piece in _splits(STREAM, random.Random(seed)):
        p.feed(piece)
    _check(out)


def _bulk(payload: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(payload), payload)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("value_len,caps", [
    (1000, [512, 2000]),      # fits, scatter across header scratch + payload
    (1000, [512, 488]),       # exact fit
    (1000, [512, 100]),       # oversized value: rest drained and dropped
    (300, [512, 2000]),       # short value fills only the start
    (0, [512]),               # empty value
    (200_000, [512, 0, 300_000]),  # zero-length buffer in the middle, bigger than scratch
    (200_000, [100, 50]),     # far oversized: mostly dropped
])
def test_scatter_sink(seed: int, value_len: int, caps: list[int]) -> None:
    rng = random.Random(seed)
    payload = rng.randbytes(value_len)
    data = b":1\r\n" + _bulk(payload) + b"+after\r\n" + _bulk(b"xyz")
    bufs = [bytearray(b"\xee" * c) for c in caps]
    out: list = []
    p = ReplyParser(out.append)
    p.push_sink(None)
    p.push_sink([memoryview(b) for b in bufs])
    p.push_sink(None)
    p.push_sink(None)
    for piece in _splits(data, rng):
        # emulate BufferedProtocol: receive into whatever get_buffer hands out
        mv = memoryview(piece)
        while len(mv):
            dst = p.get_buffer(-1)
            n = min(len(dst), len(mv), rng.choice([1, 5, 1 << 20]))
            dst[:n] = mv[:n]
            mv = mv[n:]
            p.buffer_updated(n)
    assert out == [1, value_len, b"after", b"xyz"]
    joined = b"".join(bufs)
    k = min(value_len, sum(caps))
    assert joined[:k] == payload[:k]
    assert joined[k:] == b"\xee" * (len(joined) - k)  # nothing written past the value
    assert p.idle


def test_nil_with_sink_leaves_buffer() -> None:
    buf = bytearray(b"\x01" * 16)
    out: list = []
    p = ReplyParser(out.append)
    p.push_sink([memoryview(buf)])
    p.feed(b"$-1\r\n")
    assert out == [None] and buf == b"\x01" * 16


def test_error_with_sink_is_typed() -> None:
    out: list = []
    p = ReplyParser(out.append)
    p.push_sink([memoryview(bytearray(8))])
    p.feed(b"-WRONGPASS invalid username-password pair\r\n")
    assert isinstance(out[0], AuthError) and out[0].prefix == "WRONGPASS"


def test_abandon_stops_writing() -> None:
    buf = bytearray(100)
    out: list = []
    p = ReplyParser(out.append)
    p.push_sink([memoryview(buf)])
    p.feed(b"$100\r\n" + b"a" * 10)
    assert p.filling
    p.abandon()
    dst = p.get_buffer(-1)
    dst[:5] = b"bbbbb"
    p.buffer_updated(5)
    assert buf[:10] == b"a" * 10 and buf[10:] == bytes(90) and out == []


@pytest.mark.parametrize("bad", [b"?x\r\n", b"$abc\r\n", b"$3\r\nabcXY", b":1.5\r\n"])
def test_protocol_errors(bad: bytes) -> None:
    p = ReplyParser(lambda v: None)
    with pytest.raises(ProtocolError):
        p.feed(bad)


def test_long_line_grows_scratch() -> None:
    out: list = []
    p = ReplyParser(out.append)
    p.push_sink(None, 1 << 20)
    line = b"+" + b"x" * 60_000 + b"\r\n"
    for piece in _splits(line, random.Random(1)):
        p.feed(piece)
    assert out == [b"x" * 60_000]


def test_encode_command() -> None:
    assert encode_command(("SET", b"k", 12, 1.5)) == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n$3\r\n1.5\r\n"


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["int", "simple", "bulk", "nil", "err", "array"] if depth < 3 else ["int", "bulk", "simple"])
    if kind == "int":
        return rng.randrange(-10**12, 10**12)
    if kind == "simple":
        return ("+", bytes(rng.choice(b"abcXYZ 019") for _ in range(rng.randrange(0, 30))))
    if kind == "bulk":
        return rng.randbytes(rng.choice([0, 1, 2, 13, 500, 70_000]))
    if kind == "nil":
        return None
    if kind == "err":
        return ServerError(rng.choice(["ERR boom", "WRONGTYPE x", "MOVED 1 h:1"]))
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]


def _encode(v) -> bytes:
    if isinstance(v, tuple):
        return b"+" + v[1] + b"\r\n"
    if isinstance(v, int):
        return b":%d\r\n" % v
    if v is None:
        return b"$-1\r\n"
    if isinstance(v, ServerError):
        return b"-" + v.message.encode() + b"\r\n"
    if isinstance(v, list):
        return b"*%d\r\n" % len(v) + b"".join(_encode(x) for x in v)
    return b"$%d\r\n%s\r\n" % (len(v), v)


def _same(got, want) -> bool:
    if isinstance(want, tuple):
        return got == want[1]
    if isinstance(want, ServerError):
        return type(got) is type(server_error(want.message)) and got.message == want.message
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return got == want


@pytest.mark.parametrize("seed", range(40))
def test_random_replies_random_splits_with_sinks(seed: int) -> None:
    """A property test without hypothesis: random reply trees, random sinks, random receive sizes."""
    rng = random.Random(1000 + seed)
    values = [_random_value(rng) for _ in range(rng.randrange(1, 25))]
    stream = b"".join(_encode(v) for v in values)
    out: list = []
    p = ReplyParser(out.append)
    sinks = []
    for v in values:
        if isinstance(v, bytes) and rng.random() < 0.7:  # a bulk reply with a scatter sink
            caps = [rng.choice([0, 1, 7, 512, 4096, 100_000]) for _ in range(rng.randrange(1, 4))]
            bufs = [bytearray(b"\xee" * c) for c in caps]
            sinks.append((v, bufs))
            p.push_sink([memoryview(b) for b in bufs])
        else:
            sinks.append(None)
            p.push_sink(None, 1 << 20)
    mv = memoryview(stream)
    while len(mv):
        dst = p.get_buffer(-1)
        n = min(len(dst), len(mv), rng.choice([1, 2, 3, 100, 5000, 1 << 20]))
        dst[:n] = mv[:n]
        mv = mv[n:]
        p.buffer_updated(n)
    assert len(out) == len(values)
    for got, want, sink in zip(out, values, sinks):
        if sink is None:
            assert _same(got, want), (got, want)
        else:
            value, bufs = sink
            assert got == len(value)
            joined = b"".join(bufs)
            k = min(len(value), len(joined))
            assert joined[:k] == value[:k] and joined[k:] == b"\xee" * (len(joined) - k)
    assert p.idle


def test_payload_sink_gets_the_payload_checksum_in_any_chunking():
    """A PayloadSink's crc covers exactly the bytes written from ``crc_from`` on, however they arrive."""
    import random

    from lmcache_valkey.codec import PayloadSink, crc32c
    from lmcache_valkey.transport.resp.parser import ReplyParser as Parser

    rng = random.Random(3)
    value = bytes(rng.randrange(256) for _ in range(5000))
    wire = b"$%d\r\n%s\r\n" % (len(value), value)
    for _ in range(30):
        replies = []
        p = Parser(replies.append)
        head, body = bytearray(512), bytearray(6000)
        sink = PayloadSink([memoryview(head), memoryview(body)])
        p.push_sink(sink)
        i = 0
        while i < len(wire):
            n = rng.randint(1, 700)
            p.feed(wire[i:i + n])
            i += n
        assert replies == [len(value)]
        assert bytes(head) == value[:512] and bytes(body[:4488]) == value[512:]
        assert sink.crc == crc32c(value[512:])


def _flag_stream(replies: list[bytes]) -> bytes:
    return b"".join(replies)


@pytest.mark.parametrize("seed", range(20))
def test_a_flag_run_collects_exists_replies_in_any_chunking(seed: int) -> None:
    rng = random.Random(seed)
    bits = [rng.choice((0, 1)) for _ in range(rng.choice((1, 3, 64, 512, 5000)))]
    out: list = []
    p = ReplyParser(out.append)
    p.push_no_sinks(1)
    p.push_flags(len(bits))
    p.push_no_sinks(1)
    for piece in _splits(b"+OK\r\n" + b"".join(b":%d\r\n" % b for b in bits) + b":7\r\n", rng):
        p.feed(piece)
    assert len(out) == 3 and out[0] == b"OK" and out[2] == 7
    run = out[1]
    assert list(run.flags) == bits and run.odd == {} and p.idle


@pytest.mark.parametrize("seed", range(20))
def test_other_replies_inside_a_flag_run_are_kept_aside_by_position(seed: int) -> None:
    rng = random.Random(seed)
    n = 300
    replies = [b":%d\r\n" % rng.choice((0, 1)) for _ in range(n)]
    odd_at = sorted(rng.sample(range(n), 4))
    replies[odd_at[0]] = b"-MOVED 3999 127.0.0.1:6381\r\n"
    replies[odd_at[1]] = b":12\r\n"
    replies[odd_at[2]] = b"*2\r\n:1\r\n$1\r\nx\r\n"
    replies[odd_at[3]] = b"-NOPERM no\r\n"
    out: list = []
    p = ReplyParser(out.append)
    p.push_flags(n)
    for piece in _splits(b"".join(replies), rng):
        p.feed(piece)
    (run,) = out
    assert len(run.flags) == n and set(run.odd) == set(odd_at)
    assert run.odd[odd_at[1]] == 12 and run.odd[odd_at[2]] == [1, b"x"]
    assert isinstance(run.odd[odd_at[3]], AuthError)
    for i, r in enumerate(replies):
        if i not in odd_at:
            assert run.flags[i] == int(r[1:2])
        else:
            assert run.flags[i] == 0


def test_a_flag_run_holds_each_odd_reply_to_the_small_reply_bound() -> None:
    p = ReplyParser(lambda v: None)
    p.push_flags(2)
    with pytest.raises(ProtocolError, match="bound"):
        p.feed(b":1\r\n$999999\r\n")


def test_a_flag_run_is_forgotten_when_the_connection_is_abandoned() -> None:
    out: list = []
    p = ReplyParser(out.append)
    p.push_flags(3)
    p.feed(b":1\r\n:0")
    p.abandon()
    p.feed(b"\r\n:1\r\n")
    assert out == [] and not p.filling
