"""Valkey Cluster: key slots, topology and redirections.

Pure functions and a small slot map; the I/O (asking a node for ``CLUSTER
SLOTS``) is done by the client, which hands the reply to
:func:`parse_cluster_slots`. The slot of a key is CRC16/XMODEM of the key (or of
its ``{hash tag}``) modulo 16384 — ``binascii.crc_hqx(data, 0)`` is exactly that
CRC, in C.
"""

from __future__ import annotations

import binascii
from typing import Any, Sequence

from ...config import Node
from ...errors import ProtocolError, ServerError

__all__ = [
    "SLOTS",
    "key_slot",
    "hash_tag",
    "parse_cluster_slots",
    "parse_redirect",
    "cluster_enabled",
    "SlotMap",
]

SLOTS = 16384


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


def cluster_enabled(info: bytes | str) -> bool:
    """True if an ``INFO cluster`` reply says ``cluster_enabled:1``."""
    text = info.decode() if isinstance(info, (bytes, bytearray)) else info
    for line in text.splitlines():
        if line.startswith("cluster_enabled:"):
            return line.split(":", 1)[1].strip() == "1"
    return False


def _node_of(entry: Sequence[Any], default_host: str) -> Node:
    host = entry[0]
    if isinstance(host, (bytes, bytearray)):
        host = host.decode()
    if not host or host == "?":  # the node we asked does not know its own address
        host = default_host
    return Node(host, int(entry[1]))


def parse_cluster_slots(reply: Any, default_host: str) -> list[tuple[int, int, Node, list[Node]]]:
    """``CLUSTER SLOTS`` → [(first slot, last slot, primary, replicas)]."""
    if not isinstance(reply, list):
        raise ProtocolError(f"unexpected CLUSTER SLOTS reply: {reply!r}")
    out = []
    for r in reply:
        if isinstance(r, BaseException) or len(r) < 3:
            raise ProtocolError(f"unexpected CLUSTER SLOTS entry: {r!r}")
        out.append((int(r[0]), int(r[1]), _node_of(r[2], default_host), [_node_of(x, default_host) for x in r[3:]]))
    return out


def parse_redirect(err: BaseException) -> tuple[str, int, Node] | None:
    """``MOVED 3999 127.0.0.1:6381`` / ``ASK ...`` → (kind, slot, node), else None."""
    if not isinstance(err, ServerError) or err.prefix not in ("MOVED", "ASK"):
        return None
    try:
        kind, slot, addr = err.message.split(" ")[:3]
        host, _, port = addr.rpartition(":")
        return kind, int(slot), Node(host, int(port))
    except ValueError:
        return None


class SlotMap:
    """Slot → primary node, plus the set of primaries."""

    def __init__(self) -> None:
        self.slots: list[Node | None] = [None] * SLOTS
        self.primaries: list[Node] = []

    def load(self, ranges: list[tuple[int, int, Node, list[Node]]]) -> None:
        slots: list[Node | None] = [None] * SLOTS
        primaries: dict[Node, None] = {}
        for first, last, primary, _ in ranges:
            slots[first:last + 1] = [primary] * (last + 1 - first)
            primaries[primary] = None
        self.slots = slots
        self.primaries = list(primaries)

    def node_for(self, slot: int) -> Node | None:
        return self.slots[slot]

    def set(self, slot: int, node: Node) -> None:
        self.slots[slot] = node
        if node not in self.primaries:
            self.primaries.append(node)
