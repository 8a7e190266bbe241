"""``timeout(delay)``: ``asyncio.timeout`` on every supported Python (3.10 has none).

From 3.11 on this is ``asyncio.timeout`` itself. On 3.10 an equivalent cancels the task at
the deadline and turns that cancellation into ``TimeoutError`` on the way out. The error it
raises there is also an ``asyncio.TimeoutError`` (a distinct class before 3.11), so callers
may catch either name on any version. Imports only the standard library.
"""

from __future__ import annotations

import asyncio
import sys
from types import TracebackType
from typing import Any, Optional, Type


if sys.version_info >= (3, 11):
    _Expired: Type[BaseException] = TimeoutError  # asyncio.TimeoutError is TimeoutError
else:
    class _Expired(asyncio.TimeoutError, TimeoutError):  # type: ignore[no-redef,misc]
        """3.10: one error that both ``except TimeoutError`` and ``except asyncio.TimeoutError`` catch."""


class _Timeout310:
    """``async with timeout(delay)``: the body is cancelled at the deadline; ``None`` waits forever.

    Unlike 3.11's, this one cannot tell its own cancellation from an outer ``cancel()`` that
    lands in the same loop iteration as the deadline (3.10 has no ``Task.uncancel``): then the
    outer cancel reads as a timeout. Either way the body stops.
    """

    def __init__(self, delay: Optional[float]) -> None:
        self._delay = delay
        self._task: Optional[asyncio.Task[Any]] = None
        self._handle: Optional[asyncio.TimerHandle] = None
        self._expired = False

    async def __aenter__(self) -> "_Timeout310":
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("timeout() must be used inside a task")
        self._task = task
        if self._delay is not None:
            self._handle = asyncio.get_running_loop().call_later(max(self._delay, 0.0), self._expire)
        return self

    def _expire(self) -> None:
        if self._task is not None and not self._task.done():
            self._expired = True
            self._task.cancel()

    async def __aexit__(self, et: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._expired and et is asyncio.CancelledError:
            raise _Expired() from exc
        return None

    def expired(self) -> bool:
        return self._expired


if sys.version_info >= (3, 11):
    timeout = asyncio.timeout
else:  # pragma: no cover - exercised by the Python 3.10 test environment
    timeout = _Timeout310

__all__ = ["timeout"]
