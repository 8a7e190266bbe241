"""``TierEvents``: the KV events our vLLM tier reports through ``take_events``.

vLLM's KV-event publisher (``--kv-events-config``) carries what each cache holds to routers
(llm-d, Dynamo), which place requests by it. A tier reports only the storage state it owns
(vLLM's ``OffloadingManager.take_events``), so this server announces:

* **stored**: blocks this tier wrote to Valkey, once the write is acknowledged;
* **removed**: blocks it announced that Valkey no longer holds (evicted by ``maxmemory``,
  expired, deleted), once seen: an existence check that *answered* "absent" (a failed or
  late check proves nothing and removes nothing; nor does a check sent before the block's
  latest announcement, whose store may have landed after Valkey answered).

Valkey evicts silently, so "once seen" is the best a client can do without keyspace
notifications (which managed Valkey and confined ACL users, ``resetchannels``, do not
offer): a removal is reported when the next request asks for the block.

Blocks another server stored are that server's to announce. The blocks this server vouches
for are bounded (``MAX_TRACKED``, oldest forgotten first); a forgotten block is released
from vLLM's event metadata without a public removal (``metadata_only``, vLLM 0.33+), since
it may well still be in Valkey.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Sequence

from .compat import Locality, Medium, OffloadKey, offloading_event

# Blocks this server announced and would announce the removal of: ~100 bytes each.
MAX_TRACKED = 1 << 18


class TierEvents:
    """Stored/removed events of one tier, in the order they happened (scheduler thread)."""

    def __init__(self, ownership: str, locality: Locality, max_tracked: int = MAX_TRACKED) -> None:
        self._ownership = ownership
        self._locality = locality
        self._max = max_tracked
        self._events: list[Any] = []
        # announced block -> the count of store announcements when it was last announced
        self._announced: OrderedDict[bytes, int] = OrderedDict()
        self._announcements = 0

    def stored(self, keys: Sequence[OffloadKey], req_context: Any = None) -> None:
        if not keys:
            return
        self._events.append(self._event(list(keys), removed=False, removal_expected=True, req_context=req_context))
        self._announcements += 1
        for k in keys:
            self._announced[bytes(k)] = self._announcements
            self._announced.move_to_end(bytes(k))
        forgotten = []
        while len(self._announced) > self._max:
            forgotten.append(OffloadKey(self._announced.popitem(last=False)[0]))
        if forgotten:
            event = self._event(forgotten, removed=True, metadata_only=True)
            if event is not None:  # vLLM 0.32 has no metadata-only removal: nothing to free there
                self._events.append(event)

    def announcements(self) -> int:
        """A mark to give :meth:`answered` for a check sent now."""
        return self._announcements

    def answered(self, keys: Iterable[bytes], found: Iterable[bool], asked_after: int) -> None:
        """An existence check's answers: an announced block answered absent is removed,
        unless it was announced again after the check was sent (``asked_after``)."""
        gone = []
        for k, f in zip(keys, found):
            if not f and self._announced.get(k, asked_after + 1) <= asked_after:
                del self._announced[k]
                gone.append(OffloadKey(k))
        if gone:
            self._events.append(self._event(gone, removed=True))

    def _event(self, keys: list[OffloadKey], **kw: Any) -> Any:
        return offloading_event(keys, Medium.CPU, locality=self._locality, ownership=self._ownership, **kw)

    def take(self) -> list[Any]:
        events, self._events = self._events, []
        return events

    def tracked(self) -> int:
        return len(self._announced)


__all__ = ["MAX_TRACKED", "TierEvents"]
