"""Valkey Cluster: key slots, topology and redirections.

Pure functions and a small slot map; the I/O (asking a node for ``CLUSTER
SLOTS``) is done by the client, which hands the reply to
:func:`parse_cluster_slots`. The slot of a key is CRC16/XMODEM of the key (or of
its ``{hash tag}``) modulo 16384 — ``binascii.crc_hqx(data, 0)`` is exactly that
CRC, in C.
"""

from __future__ import annotations

import binascii
from typing import Any

from ...config import Node
from ...errors import CLUSTER_SLOTS, ProtocolError, Redirect
from .parser import describe

__all__ = [
    "SLOTS",
    "key_slot",
    "hash_tag",
    "parse_cluster_slots",
    "parse_redirect",
    "cluster_enabled",
    "SlotMap",
]

SLOTS = CLUSTER_SLOTS


def hash_tag(key: bytes) -> bytes:
    """The part of ``key`` that is hashed: the first non-empty ``{...}``, else the key."""
    s = key.find(b"{")
    if s >= 0:
        e = key.find(b"}", s + 1)
        if e > s + 1:
            return key[s + 1:e]
    return key


def key_slot(key: bytes) -> int:
    return binascii.crc_hqx(hash_tag(key), 0) & (SLOTS - 1)


def cluster_enabled(info: Any) -> bool:
    """True if an ``INFO cluster`` reply says ``cluster_enabled:1``."""
    if not isinstance(info, (bytes, bytearray)):
        raise ProtocolError(f"unexpected INFO reply: {describe(info)}")
    for line in info.decode("utf-8", "replace").splitlines():
        if line.startswith("cluster_enabled:"):
            return line.split(":", 1)[1].strip() == "1"
    return False


def _node_of(entry: Any, default_host: str) -> Node:
    """One ``[host, port, ...]`` entry of CLUSTER SLOTS; anything else is a ProtocolError."""
    if not isinstance(entry, list) or len(entry) < 2:
        raise ProtocolError(f"unexpected CLUSTER SLOTS node: {describe(entry)}")
    host, port = entry[0], entry[1]
    if not isinstance(host, bytes) or len(host) > 255 or type(port) is not int or not 0 < port < 65536:
        raise ProtocolError(f"unexpected CLUSTER SLOTS node address: {describe(host)} {describe(port)}")
    name = host.decode("ascii", "replace")
    if not name.isprintable() or " " in name:
        raise ProtocolError(f"unexpected CLUSTER SLOTS host: {describe(host)}")
    if not name or name == "?":  # the node we asked does not know its own address
        name = default_host
    return Node(name, port)


def parse_cluster_slots(reply: Any, default_host: str) -> list[tuple[int, int, Node, list[Node]]]:
    """``CLUSTER SLOTS`` → [(first slot, last slot, primary, replicas)].

    Every field is checked (slot numbers inside 0..16383, first <= last, host and port
    well formed): a reply that is not exactly that shape is a ProtocolError, never a slot
    table sized by a number a server made up.
    """
    if not isinstance(reply, list):
        raise ProtocolError(f"unexpected CLUSTER SLOTS reply: {describe(reply)}")
    out = []
    for r in reply:
        if not isinstance(r, list) or len(r) < 3:
            raise ProtocolError(f"unexpected CLUSTER SLOTS entry: {describe(r)}")
        first, last = r[0], r[1]
        if type(first) is not int or type(last) is not int or not 0 <= first <= last < SLOTS:
            raise ProtocolError(f"CLUSTER SLOTS range {describe(first)}..{describe(last)} is not within 0..{SLOTS - 1}")
        out.append((first, last, _node_of(r[2], default_host), [_node_of(x, default_host) for x in r[3:]]))
    return out


def parse_redirect(err: BaseException) -> tuple[str, int, Node] | None:
    """A MOVED/ASK error (already parsed and checked when read) → (kind, slot, node), else None."""
    if not isinstance(err, Redirect):
        return None
    return err.kind, err.slot, Node(err.host, err.port)


class SlotMap:
    """Slot → primary node, plus the set of primaries.

    ``index[slot]`` is the position of that slot's primary in ``primaries`` (a slot no primary
    claims yet: 0, the node that will answer MOVED, as :meth:`node_for`'s callers fall back
    to), so a batch of many keys is grouped by node with C-level list operations, not a
    Python call (and a dataclass hash) per key.
    """

    def __init__(self) -> None:
        self.slots: list[Node | None] = [None] * SLOTS
        self.index: list[int] = [0] * SLOTS
        self.primaries: list[Node] = []

    def load(self, ranges: list[tuple[int, int, Node, list[Node]]]) -> None:
        slots: list[Node | None] = [None] * SLOTS
        index = [0] * SLOTS
        primaries: dict[Node, int] = {}
        for first, last, primary, _ in ranges:
            slots[first:last + 1] = [primary] * (last + 1 - first)
            j = primaries.setdefault(primary, len(primaries))
            index[first:last + 1] = [j] * (last + 1 - first)
        self.slots = slots
        self.index = index
        self.primaries = list(primaries)

    def node_for(self, slot: int) -> Node | None:
        return self.slots[slot]

    def set(self, slot: int, node: Node) -> None:
        self.slots[slot] = node
        if node not in self.primaries:
            self.primaries.append(node)
        self.index[slot] = self.primaries.index(node)
