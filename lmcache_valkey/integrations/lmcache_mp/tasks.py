"""Task ids, finished results and the three event fds of an MP L2 adapter.

LMCache's store and prefetch controllers call the adapter from two threads and poll one
event fd per kind of task; a controller maps each fd back to its adapter, so the three
must be distinct. A result is handed out exactly once (``pop_*``). Everything here is
guarded by one lock and never blocks: results are posted from our I/O loop, read from the
controllers' threads.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from lmcache.v1.platform import create_event_notifier

STORE, LOOKUP, LOAD = "store", "lookup", "load"
KINDS = (STORE, LOOKUP, LOAD)


class TaskBoard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._fds = {kind: create_event_notifier() for kind in KINDS}
        self._done: dict[str, dict[int, Any]] = {kind: {} for kind in KINDS}
        self._running: dict[str, set[int]] = {kind: set() for kind in KINDS}
        self._closed = False

    def fileno(self, kind: str) -> int:
        return self._fds[kind].fileno()

    def start(self, kind: str) -> int:
        with self._lock:
            task_id = next(self._ids)
            self._running[kind].add(task_id)
        return task_id

    def finish(self, kind: str, task_id: int, result: Any) -> None:
        """Post a result (once per task; a second post is ignored) and wake the controller."""
        with self._lock:
            if task_id not in self._running[kind]:
                return
            self._running[kind].discard(task_id)
            self._done[kind][task_id] = result
            closed = self._closed
        if not closed:
            self._fds[kind].notify()

    def pop(self, kind: str, task_id: int) -> Any | None:
        with self._lock:
            return self._done[kind].pop(task_id, None)

    def pop_all(self, kind: str) -> dict[int, Any]:
        with self._lock:
            done, self._done[kind] = self._done[kind], {}
        return done

    def running(self) -> dict[str, int]:
        with self._lock:
            return {kind: len(ids) for kind, ids in self._running.items()}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for fd in self._fds.values():
            fd.close()
