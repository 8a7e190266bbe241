"""Sans-I/O RESP2 reply parser and command encoder.

The parser never touches a socket. Its owner (a connection, or a test) asks
:meth:`ReplyParser.get_buffer` where the next received bytes should go, writes
them there, and reports how many with :meth:`ReplyParser.buffer_updated` — the
shape of :class:`asyncio.BufferedProtocol`, so the kernel copies straight into
the right place. :meth:`ReplyParser.feed` does the same from a ``bytes`` object
(tests).

Each top-level reply may have a *sink*: a list of writable byte memoryviews
(e.g. a 512-byte header scratch, then the payload destination). When that reply
is a bulk string its bytes are written into the sink buffers in order, with no
intermediate ``bytes`` object; bytes beyond the sink's capacity are drained and
dropped. The reply's value is then the bulk's true length (``int``), so the
caller can tell a short or oversized value. A nil bulk is ``None``. Without a
sink a bulk is ``bytes``.

Error replies become typed exception *objects* (via
:func:`lmcache_valkey.errors.server_error`) delivered as values, never raised:
inside an array (EXEC, pipelines) one bad element must not hide the others.
A status reply (``+OK``) is a :class:`SimpleString`, so it is never confused
with a bulk string holding the same bytes.

A *flag run* (:meth:`ReplyParser.push_flags`) stands for the ``n`` replies of a pipeline
of commands that each answer ``:0`` or ``:1`` (``EXISTS`` of one key): they are checked
and collected with a few byte-string operations per received piece, not one call per
reply, and delivered as one :class:`FlagRun`. Any other reply inside the run is parsed
the ordinary way, within ``SMALL_REPLY_MAX``, and kept aside by its position.

The server is not trusted (docs/resp-reply-bounds.md). Each expected reply
carries a *bound*: the most bytes it may hold outside its sink (integers,
statuses, errors, sink-less bulks, array elements at ``ITEM_COST`` each). A
reply that declares more, nests deeper than ``MAX_DEPTH``, sends a line longer
than ``MAX_LINE``, a length other than -1 below zero, a number that is not
plain decimal, or anything but a bulk string, nil or an error where a sink is
waiting, raises :class:`~lmcache_valkey.errors.ProtocolError` at once; the
connection must then be dropped. A sink-less bulk is received into pieces that
grow as its bytes arrive (the first ``PIECE`` bytes, then doubling), so a
declared length never allocates memory the server has not sent.

This module imports nothing from asyncio or the rest of the transport.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import Any, Callable, Sequence

from ...codec import crc32c
from ...errors import ProtocolError, server_error

__all__ = [
    "ReplyParser",
    "SimpleString",
    "encode_command",
    "encode_args",
    "as_byte_view",
    "describe",
    "Sink",
    "SMALL_REPLY_MAX",
    "FlagRun",
    "ITEM_COST",
    "MAX_DEPTH",
    "MAX_LINE",
    "parse_number",
]

Sink = Sequence[memoryview]

# Bound of a reply that can only be an integer, a status, nil or an error outside its
# sink (EXISTS, SET, UNLINK, and GET's non-payload part): room for any error message.
SMALL_REPLY_MAX = 4 << 10
# Budget charged per value on top of its bytes (an object and a list slot): a bound
# also caps how many elements an array may declare.
ITEM_COST = 16
# Deepest array nesting accepted. The deepest reply a client here asks for (COMMAND
# INFO's key specs) nests 6 levels; hiredis stops at 9.
MAX_DEPTH = 16
# Longest line (status, error, integer, length header) accepted.
MAX_LINE = 64 << 10
# First piece of a sink-less bulk that is not all here yet; later pieces double.
PIECE = 64 << 10
# Longest decimal number accepted (lengths, integers): 18 digits fit in 63 bits.
_MAX_DIGITS = 18

_SCRATCH = 64 * 1024
_MIN_FREE = 4096
_CRLF = b"\r\n"

# parser modes
_LINES = 0  # receiving into the scratch buffer, parsing lines
_FILL = 1  # receiving straight into the current sink buffer

_EMPTY: list[memoryview] = []

# A flag run's expected replies, 4 bytes each: ':0\r\n' or ':1\r\n'.
_FLAGS: Any = object()  # stands in the sink queue for a whole run
_FLAG_REPLY = b":0\r\n"
_ONE_AS_ZERO = bytes.maketrans(b"1", b"0")  # both flag replies look like _FLAG_REPLY
_DIGIT_TO_FLAG = bytes.maketrans(b"01", b"\x00\x01")


class FlagRun:
    """The replies of a run pushed with :meth:`ReplyParser.push_flags`, as one value.

    ``flags[i]`` is 1 or 0 for reply i; a reply that was anything else (an error object, a
    redirection, another integer, a bulk) has ``flags[i] == 0`` and its parsed value in
    ``odd[i]``, for the caller to judge.
    """

    __slots__ = ("flags", "odd", "left")

    def __init__(self, n: int) -> None:
        self.flags = bytearray()
        self.odd: dict[int, Any] = {}
        self.left = n


class SimpleString(bytes):
    """A status reply (``+OK``), as opposed to a bulk string with the same bytes."""

    __slots__ = ()


_OK = SimpleString(b"OK")


def describe(value: Any, limit: int = 48) -> str:
    """A short, bounded description of a reply value for error messages (never a full repr:
    a hostile reply may be huge or nested thousands deep)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        b = bytes(value[:limit])
        return f"{type(value).__name__} {b!r}{'...' if len(value) > limit else ''}"
    if isinstance(value, list):
        return f"array of {len(value)}"
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {str(value)[:limit]}"
    if isinstance(value, int):
        return f"integer {value}"
    return type(value).__name__


def _show(line: bytes | bytearray) -> str:
    return repr(bytes(line[:32])) + ("..." if len(line) > 32 else "")


def _number(line: bytes | bytearray, what: str) -> int:
    """A RESP number: plain decimal, an optional leading ``-``, at most 18 digits.
    (``int()`` alone would also take ``+5``, `` 5``, ``5_0`` and 4300-digit numbers.)"""
    digits = line[1:] if line[:1] == b"-" else line
    if not digits.isdigit() or len(digits) > _MAX_DIGITS:
        raise ProtocolError(f"bad {what} {_show(line)}")
    return int(line)


parse_number = _number  # the fabric control connections' parser (transport/fabric/sessions.py) reads numbers alike


def as_byte_view(buf: Any, *, writable: bool = False) -> memoryview:
    """A flat unsigned-byte memoryview over ``buf`` (no copy)."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    if writable and mv.readonly:
        raise TypeError("destination buffer is read-only")
    return mv


def _arg(a: Any) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, bool):
        raise TypeError("bool is not a valid RESP argument")
    if isinstance(a, int):
        return b"%d" % a
    if isinstance(a, float):
        return repr(a).encode()
    if isinstance(a, (bytearray, memoryview)):
        return bytes(a)
    raise TypeError(f"cannot encode {type(a).__name__} as a RESP argument")


def encode_args(args: Sequence[Any]) -> list[bytes]:
    return [_arg(a) for a in args]


def encode_command(args: Sequence[Any]) -> bytes:
    """One command as a RESP array of bulk strings (for small commands)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = _arg(a)
        parts.append(b"$%d\r\n" % len(b))
        parts.append(b)
        parts.append(_CRLF)
    return b"".join(parts)


_NO_REQUEST = (None, SMALL_REPLY_MAX)


class ReplyParser:
    """Incremental RESP2 reply parser with scatter sinks for bulk replies.

    ``on_reply(value)`` is called synchronously for each complete top-level
    reply, in order. :meth:`push_sink` must be called once per expected reply
    (``None`` for no sink), in the order the commands were sent, with the
    bound of that reply.
    """

    __slots__ = (
        "_on_reply", "_buf", "_mv", "_start", "_end", "_mode", "_sinks", "_sink",
        "_tgt", "_ti", "_cur", "_off", "_left", "_drop", "_total", "_pieces",
        "_await_crlf", "_stack", "_dead", "_crc_from", "_budget", "_bound", "_run",
    )

    def __init__(self, on_reply: Callable[[Any], None]) -> None:
        self._on_reply = on_reply
        self._buf = bytearray(_SCRATCH)
        self._mv = memoryview(self._buf)
        self._start = 0  # first unparsed byte in scratch
        self._end = 0  # end of received bytes in scratch
        self._mode = _LINES
        self._sinks: deque[tuple[Sink | None, int]] = deque()  # (sink, bound) per expected reply
        self._sink: Sink | None = None  # sink of the reply being parsed
        self._budget = 0  # bytes the reply being parsed may still hold outside its sink
        self._bound = 0  # its whole bound (for error messages)
        self._tgt: Sequence[memoryview] = _EMPTY  # buffers of the bulk being filled
        self._ti = 0  # index of the current buffer in _tgt
        self._cur: memoryview | None = None  # current buffer
        self._off = 0  # write offset in _cur
        self._left = 0  # payload bytes still to go into buffers
        self._drop = 0  # payload bytes to drain and drop after the buffers are full
        self._total = 0  # declared bulk length
        self._pieces: list[bytearray] | None = None  # sink-less bulk being received, piece by piece
        self._await_crlf = False  # a bulk payload is done; its CRLF is next
        self._stack: list[list[Any]] = []  # [remaining, items] per open array
        self._dead = False
        # For a PayloadSink: checksum the bytes written into buffers from this index on.
        self._crc_from: int | None = None
        self._run: FlagRun | None = None  # the flag run being received

    # --- sinks -------------------------------------------------------------

    def push_sink(self, sink: Sink | None, bound: int = SMALL_REPLY_MAX) -> None:
        """Expect one more reply: its bulk goes into ``sink``; outside it, at most ``bound`` bytes."""
        self._sinks.append((sink, bound))

    def push_no_sinks(self, n: int, bound: int = SMALL_REPLY_MAX) -> None:
        """Expect ``n`` more replies without sinks, each within ``bound`` bytes."""
        self._sinks.extend(repeat((None, bound), n))

    def push_flags(self, n: int) -> None:
        """Expect ``n`` more replies that should each be ``:0`` or ``:1``, delivered together
        as one :class:`FlagRun` value (each other reply within ``SMALL_REPLY_MAX``)."""
        if n > 0:
            self._sinks.append((_FLAGS, n))

    @property
    def idle(self) -> bool:
        """True when no reply is partly received and none is expected."""
        return (not self._sinks and self._sink is None and self._run is None and self._end == self._start
                and self._mode == _LINES)

    def abandon(self) -> None:
        """Forget every sink and stop writing into caller buffers, forever.

        Called when the connection is aborted; afterwards :meth:`get_buffer`
        only ever returns the parser's own scratch buffer.
        """
        self._dead = True
        self._sinks.clear()
        self._sink = None
        self._tgt = _EMPTY
        self._cur = None
        self._mode = _LINES
        self._start = self._end = 0
        self._stack.clear()
        self._pieces = None
        self._run = None

    # --- BufferedProtocol-shaped entry points ---------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        if self._mode == _FILL:
            cur = self._cur
            off = self._off
            n = len(cur) - off  # type: ignore[arg-type]
            if n > self._left:
                n = self._left
            return cur[off:off + n]  # type: ignore[index]
        start, end = self._start, self._end
        if start == end:
            self._start = self._end = end = 0
        elif len(self._buf) - end < _MIN_FREE:
            if start > 0:  # compact
                n = end - start
                self._buf[0:n] = self._buf[start:end]
                self._start, self._end, end = 0, n, n
            if len(self._buf) - end < _MIN_FREE:  # grow (a long line, at most MAX_LINE)
                new = bytearray(2 * len(self._buf))
                new[:end] = self._mv[:end]
                self._buf, self._mv = new, memoryview(new)
        return self._mv[end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._dead:
            return
        if self._mode == _FILL:
            if self._crc_from is not None and self._ti >= self._crc_from:
                # The bytes the kernel just wrote are still in cache: checksum them now.
                tgt = self._tgt
                tgt.crc = crc32c(self._cur[self._off:self._off + nbytes], tgt.crc)  # type: ignore[attr-defined,index]
            self._off += nbytes
            self._left -= nbytes
            if self._off == len(self._cur) or self._left == 0:  # type: ignore[arg-type]
                self._advance_target()
                if self._mode == _LINES:
                    self._process()
            return
        self._end += nbytes
        self._process()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Feed received bytes (copying them through :meth:`get_buffer`)."""
        mv = memoryview(data).cast("B")
        while len(mv):
            buf = self.get_buffer()
            n = min(len(buf), len(mv))
            buf[:n] = mv[:n]
            mv = mv[n:]
            self.buffer_updated(n)

    @property
    def fill_left(self) -> int:
        """Payload bytes still due into the sink buffers (while :attr:`filling`)."""
        return self._left

    @property
    def filling(self) -> bool:
        """True while received bytes go straight into a sink buffer."""
        return self._mode == _FILL

    # --- internals -----------------------------------------------------------

    def _next_target(self, ti: int) -> int:
        """Index of the first non-empty buffer of the bulk at or after ``ti``; past the last
        one, a sink-less bulk with bytes still due gets a new piece (double the bytes so far)."""
        tgt = self._tgt
        while ti < len(tgt) and len(tgt[ti]) == 0:
            ti += 1
        pieces = self._pieces
        if ti == len(tgt) and pieces is not None and self._left:
            piece = bytearray(min(self._left, max(PIECE, self._total - self._left)))
            pieces.append(piece)
            tgt.append(memoryview(piece))  # type: ignore[attr-defined]  # our own list
        return ti

    def _advance_target(self) -> None:
        """The current buffer is full or the payload ended: move on."""
        if self._left > 0:
            ti = self._next_target(self._ti + 1)
            if ti < len(self._tgt):
                self._ti = ti
                self._cur = self._tgt[ti]
                self._off = 0
                return
            self._drop += self._left  # sink is full: drain the rest
            self._left = 0
        self._mode = _LINES
        self._cur = None
        self._tgt = _EMPTY
        self._await_crlf = True

    def _charge(self, nbytes: int, what: str) -> None:
        """Count one value of ``nbytes`` against the reply's bound (``what``: a constant, so
        that the common path formats nothing)."""
        self._budget -= nbytes + ITEM_COST
        if self._budget < 0:
            raise ProtocolError(f"{what} of {nbytes} bytes exceeds the {self._bound}-byte bound of this reply")

    def _start_bulk(self, length: int, sink: Sink | None) -> None:
        """Header ``$length`` parsed; route the payload."""
        self._total = length
        if sink is None:
            self._charge(length, "a bulk string")
            avail = self._end - self._start
            if avail >= length + 2:  # fast path: small bulk already here
                s = self._start
                if self._buf[s + length:s + length + 2] != _CRLF:
                    raise ProtocolError("bulk string not terminated by CRLF")
                self._start = s + length + 2
                self._value(bytes(self._buf[s:s + length]))
                return
            # Received piece by piece as bytes arrive: the declared length alone allocates nothing.
            first = bytearray(min(length, max(avail, PIECE)))
            self._pieces = [first]
            sink = [memoryview(first)]
        self._tgt = sink
        self._ti = 0
        self._left = length
        self._drop = 0
        self._crc_from = getattr(sink, "crc_from", None)
        if self._crc_from is not None:
            sink.crc = 0  # type: ignore[attr-defined]  # (a retried op starts over)
        # Copy whatever payload already sits in scratch into the sink buffers.
        ti = self._next_target(0)
        while self._left and ti < len(sink):
            cur = sink[ti]
            avail = self._end - self._start
            if not avail:
                break
            n = min(len(cur), self._left, avail)
            s = self._start
            cur[0:n] = self._mv[s:s + n]
            if self._crc_from is not None and ti >= self._crc_from:
                sink.crc = crc32c(cur[0:n], sink.crc)  # type: ignore[attr-defined]
            self._start = s + n
            self._left -= n
            if n < len(cur) and self._left:  # scratch exhausted mid-buffer
                self._ti, self._cur, self._off = ti, cur, n
                self._mode = _FILL
                return
            ti = self._next_target(ti + 1)
        if self._left and ti < len(sink):
            self._ti, self._cur, self._off = ti, sink[ti], 0
            self._mode = _FILL
            return
        # Either all payload is here, or the sink is full: drop the rest.
        self._drop += self._left
        self._left = 0
        self._tgt = _EMPTY
        self._await_crlf = True

    def _finish_bulk(self) -> None:
        pieces = self._pieces
        if pieces is not None:
            self._pieces = None
            self._value(bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces))
        else:
            self._value(self._total)

    def _value(self, v: Any) -> None:
        """A complete value: attach it to the open array, or emit it."""
        stack = self._stack
        while stack:
            top = stack[-1]
            top[1].append(v)
            top[0] -= 1
            if top[0]:
                return
            stack.pop()
            v = top[1]
        self._sink = None
        run = self._run
        if run is None:
            self._on_reply(v)
            return
        # One reply of a flag run that is not :0/:1: kept aside for the caller.
        run.odd[len(run.flags)] = v
        run.flags.append(0)
        run.left -= 1
        if not run.left:
            self._run = None
            self._on_reply(run)

    def _take_flags(self, run: FlagRun, k: int) -> int:
        """Consume the leading well-formed flag replies among the next ``k`` (all 4 bytes
        long, all complete in scratch); returns how many."""
        s = self._start
        seg = self._buf[s:s + 4 * k]
        if seg.translate(_ONE_AS_ZERO) != _FLAG_REPLY * k:
            # Something else in there: take the well-formed ones before it (found by halving:
            # this runs only on redirections and errors), then parse that reply alone.
            masked = seg.translate(_ONE_AS_ZERO)
            lo, hi = 0, k  # the first lo replies are well-formed; reply hi-1 may not be
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if masked[:4 * mid] == _FLAG_REPLY * mid:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
            if not k:
                return 0
            seg = seg[:4 * k]
        run.flags += seg[1::4].translate(_DIGIT_TO_FLAG)
        run.left -= k
        self._start = s + 4 * k
        return k

    def _process(self) -> None:
        buf = self._buf
        while not self._dead:
            if self._drop:
                n = min(self._drop, self._end - self._start)
                self._start += n
                self._drop -= n
                if self._drop:
                    return
            if self._await_crlf:
                if self._end - self._start < 2:
                    return
                s = self._start
                if buf[s:s + 2] != _CRLF:
                    raise ProtocolError("bulk string not terminated by CRLF")
                self._start = s + 2
                self._await_crlf = False
                self._finish_bulk()
                continue
            if self._mode == _FILL:
                return
            if not self._stack:  # between top-level replies
                run = self._run
                if run is None and self._sinks and self._sinks[0][0] is _FLAGS:
                    run = self._run = FlagRun(self._sinks.popleft()[1])
                if run is not None:
                    k = min(run.left, (self._end - self._start) >> 2)
                    if k and self._take_flags(run, k):
                        if not run.left:
                            self._run = None
                            self._on_reply(run)
                        continue
                    # fewer than 4 bytes here, or a reply of another shape: parsed below
            start = self._start
            if start >= self._end:
                return
            idx = buf.find(_CRLF, start, min(self._end, start + MAX_LINE + 2))
            if idx < 0:
                if self._end - start > MAX_LINE:
                    raise ProtocolError(f"reply line longer than {MAX_LINE} bytes")
                return
            kind = buf[start]
            self._start = idx + 2
            top_level = not self._stack
            if top_level and self._run is not None:  # an odd reply inside a flag run
                self._sink = None
                self._budget = self._bound = SMALL_REPLY_MAX
            elif top_level:
                sinks = self._sinks
                sink, self._bound = sinks.popleft() if sinks else _NO_REQUEST
                self._budget = self._bound
                if kind == 58 and sink is None:  # ':' fast path: a run of integer replies
                    on_reply = self._on_reply
                    end = self._end
                    while True:
                        if idx - start == 2:  # one digit: what EXISTS answers, parsed without a slice
                            v = buf[start + 1] - 48
                            if not 0 <= v <= 9:
                                raise ProtocolError(f"bad integer {_show(buf[start + 1:idx])}")
                            on_reply(v)
                        else:
                            on_reply(_number(buf[start + 1:idx], "integer"))
                        if self._dead:
                            return
                        start = self._start
                        if start >= end or buf[start] != 58:
                            break
                        if sinks and sinks[0][0] is not None:  # a sink or a flag run: not ours
                            break
                        idx = buf.find(_CRLF, start, end)  # (scratch holds at most ~2 * MAX_LINE)
                        if idx < 0:
                            break
                        self._start = idx + 2
                        if sinks:
                            sinks.popleft()
                    continue
                if sink is not None and kind != 36 and kind != 45:
                    raise ProtocolError(f"expected a bulk string, got a reply of type {bytes([kind])!r}")
                self._sink = sink
            line = bytes(buf[start + 1:idx])
            if kind == 36:  # '$'
                n = _number(line, "bulk length")
                if n >= 0:
                    self._start_bulk(n, self._sink if top_level else None)
                elif n == -1:
                    self._charge(0, "a nil")
                    self._value(None)
                else:
                    raise ProtocolError(f"bad bulk length {n}")
            elif kind == 43:  # '+'
                if line == b"OK":  # what SET answers: counted inline, no call
                    self._budget -= 2 + ITEM_COST
                    if self._budget < 0:
                        self._charge(0, "a status")
                    self._value(_OK)
                else:
                    self._charge(len(line), "a status")
                    self._value(SimpleString(line))
            elif kind == 58:  # ':'
                self._charge(0, "an integer")
                self._value(_number(line, "integer"))
            elif kind == 45:  # '-'
                self._charge(len(line), "an error")
                self._value(server_error(line.decode("utf-8", "replace")))
            elif kind == 42:  # '*'
                n = _number(line, "array length")
                if n > 0:
                    if len(self._stack) >= MAX_DEPTH:
                        raise ProtocolError(f"arrays nested deeper than {MAX_DEPTH}")
                    self._charge(n * ITEM_COST, f"an array of {n} elements" if n * ITEM_COST > self._budget else "an array")
                    self._stack.append([n, []])
                elif n == 0:
                    self._charge(0, "an array")
                    self._value([])
                elif n == -1:
                    self._charge(0, "a nil")
                    self._value(None)
                else:
                    raise ProtocolError(f"bad array length {n}")
            else:
                raise ProtocolError(f"unexpected reply type byte {bytes([kind])!r}")
