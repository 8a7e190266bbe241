"""One node's SCAN walk, bounded: a server that lies about its cursor cannot keep a caller
looping or collecting keys forever (docs/scan-bounds.md).

A real server's walk ends with cursor ``0`` and never hands out the same cursor twice in one
walk (the reverse-binary cursor only moves forward, through rehashing and per-slot tables
alike). So a walk is refused, as a counted ``ProtocolError``, when a reply is not
``[decimal cursor, [bulk key, ...]]``, when a cursor comes back (Brent's cycle detection:
constant memory, any cycle length), or when it yields more than ``SCAN_MAX_KEYS`` keys; and
it ends with ``DeadlineExceeded`` once the replies took ``SCAN_BUDGET_S`` seconds in all
(time spent waiting on the server only: a consumer that pauses between keys, e.g. a caller
listing page by page, does not use it up).

Every transport's ``scan_iter`` walks each node with :func:`scan_walk`. Knows nothing of
keys or chunks; imports no third-party library.
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator, Awaitable, Callable

from .. import metrics
from ..errors import DeadlineExceeded, ProtocolError

__all__ = ["SCAN_BUDGET_S", "SCAN_MAX_KEYS", "ScanWalk", "scan_walk"]

# Seconds of server replies one node's walk may take. A real walk over a million keys with
# COUNT 1000 is about a thousand replies (a second or two); this leaves room for ten times
# more keys on a loaded server.
SCAN_BUDGET_S = 120.0
# Keys one node's walk may yield: more chunks than a node's RAM holds (4 Mi chunks of 64 KiB
# fill 256 GiB), so only a server that makes keys up reaches it.
SCAN_MAX_KEYS = 1 << 22
_CURSOR_MAX = (1 << 64) - 1  # cursors are unsigned 64-bit numbers


class ScanWalk:
    """The state of one node's walk: ``cursor`` to send next, ``done`` once the server said
    0. :meth:`step` checks each reply and returns its keys."""

    def __init__(self, where: str, *, budget_s: float | None = None, max_keys: int | None = None) -> None:
        self.where = where
        self.cursor = b"0"
        self.done = False
        self.steps = 0
        self.keys = 0
        self._budget = SCAN_BUDGET_S if budget_s is None else budget_s
        self._max_keys = SCAN_MAX_KEYS if max_keys is None else max_keys
        self._spent = 0.0
        # Brent's cycle detection: a cursor saved at steps 1, 2, 4, 8, ...; meeting it again
        # means the server walks in a circle.
        self._mark: int | None = None
        self._power = 1
        self._lam = 0
        self._started = 0.0

    def left_s(self) -> float:
        """Seconds of replies this walk may still wait for (raises once none are left)."""
        left = self._budget - self._spent
        if left <= 0:
            self.spent()
        self._started = time.monotonic()
        return left

    def spent(self) -> None:
        """The budget ran out (before or while waiting for a reply): a counted deadline."""
        self._refuse(DeadlineExceeded(
            f"SCAN on {self.where} took over {self._budget:g}s of replies ({self.steps} steps, {self.keys} keys)"))

    def step(self, reply: Any) -> list[bytes]:
        """Checks one SCAN reply (sent with :attr:`cursor`, after :meth:`left_s`); returns
        its keys and moves the cursor on."""
        self._spent += time.monotonic() - self._started
        self.steps += 1
        if (not isinstance(reply, (list, tuple)) or len(reply) != 2 or not isinstance(reply[1], (list, tuple))
                or not all(type(k) is bytes for k in reply[1])):
            self._refuse(ProtocolError(f"unexpected SCAN reply from {self.where}: {_shape(reply)}"))
        raw, keys = reply[0], reply[1]
        cursor = _cursor(raw)
        if cursor is None:
            self._refuse(ProtocolError(f"SCAN on {self.where}: bad cursor {_shape(raw)}"))
        self.keys += len(keys)
        if self.keys > self._max_keys:
            self._refuse(ProtocolError(f"SCAN on {self.where} yielded over {self._max_keys} keys"))
        if cursor == 0:
            self.done = True
            return list(keys)
        if cursor == self._mark:
            self._refuse(ProtocolError(
                f"SCAN on {self.where} returned cursor {cursor} a second time (step {self.steps}): "
                "a real walk never does"))
        self._lam += 1
        if self._lam == self._power:
            self._mark, self._power, self._lam = cursor, self._power * 2, 0
        self.cursor = b"%d" % cursor
        return list(keys)

    def _refuse(self, error: Exception) -> None:
        metrics.record_error("scan", getattr(error, "cause", "error"))
        raise error


async def scan_walk(where: str, call: Callable[[bytes, float], Awaitable[Any]], timeout: float) -> AsyncIterator[bytes]:
    """The keys of one node's bounded walk. ``call(cursor, wait_s)`` sends ``SCAN cursor
    ...`` and returns the reply within ``wait_s`` (one step's ``timeout``, less when the
    walk's budget has less left)."""
    walk = ScanWalk(where)
    while not walk.done:
        left = walk.left_s()
        try:
            reply = await call(walk.cursor, min(timeout, left))
        except DeadlineExceeded:
            if left < timeout:  # the budget, not the step's own deadline, ran out
                walk.spent()
            raise
        for k in walk.step(reply):
            yield k


def _cursor(raw: Any) -> int | None:
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, (bytes, str)) and 0 < len(raw) <= 20 and raw.isdigit() and raw.isascii():
        value = int(raw)
    else:
        return None
    return value if 0 <= value <= _CURSOR_MAX else None


def _shape(value: Any) -> str:
    if isinstance(value, (bytes, str)):
        return f"{type(value).__name__} {value[:24]!r}"
    if isinstance(value, (list, tuple)):
        return f"array of {len(value)}"
    return type(value).__name__
