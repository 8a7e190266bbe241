"""The promotion/control protocol between workers and ``tierd``, carried by Valkey lists.

See docs/tiering-promotion.md. Keys (inside the tenant's ACL pattern ``~<prefix>:<tenant>:*``)::

    <prefix>:<tenant>:_tierd:req           requests, RPUSH by workers, BLPOP by tierd (FIFO)
    <prefix>:<tenant>:_tierd:rep:<uuid>    replies to one worker process, RPUSH by tierd,
                                           BLPOP by that worker; PEXPIRE keeps it from lingering
    <prefix>:<tenant>:_tierd:del           delete intents (hash), :func:`delete_key`
    <prefix>:<tenant>:_tierd:ram, :mk      tierd's own indexes (sorted sets, :mod:`.key_index`)

Messages are msgpack maps. Request: ``{"op", "id", "reply", "ttl_ms", "sent_ms", ...}``;
reply: ``{"id", "ok", "result"}``. The ops, their fields and who answers them: the op table
of :mod:`.service` (``OPS``).
"""

from __future__ import annotations

from typing import Any

import msgpack

REPLY_TTL_MS = 60_000
REQUEST_MAX = 100_000  # requests kept in the list while tierd is down (oldest trimmed)


def request_key(key_prefix: str, tenant: str) -> bytes:
    return f"{key_prefix}:{tenant}:_tierd:req".encode()


def reply_key(key_prefix: str, tenant: str, worker_id: str) -> bytes:
    return f"{key_prefix}:{tenant}:_tierd:rep:{worker_id}".encode()


def delete_key(key_prefix: str, tenant: str) -> bytes:
    """Hash of delete intents (data key -> Unix ms): written before any copy is removed, so a
    delete the object store could not take yet survives a restart of tierd or the worker."""
    return f"{key_prefix}:{tenant}:_tierd:del".encode()


def ram_index_key(key_prefix: str, tenant: str) -> bytes:
    """tierd's index of the tenant's chunk values in RAM (:mod:`.key_index`): a sorted set,
    member = data key. tierd never lists the keyspace (docs/tiering-index.md)."""
    return f"{key_prefix}:{tenant}:_tierd:ram".encode()


def marker_index_key(key_prefix: str, tenant: str) -> bytes:
    """tierd's index of the tier markers it wrote (:mod:`.key_index`), member = data key."""
    return f"{key_prefix}:{tenant}:_tierd:mk".encode()


def pack(msg: dict[str, Any]) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def unpack(data: bytes) -> dict[str, Any]:
    msg = msgpack.unpackb(data, raw=False)
    if not isinstance(msg, dict):
        raise ValueError("message is not a map")
    return msg


def unpack_bounded(data: bytes, *, max_str: int, max_bin: int, max_array: int, max_map: int) -> Any:
    """Decode an untrusted message; no string, byte string, array or map longer than its
    bound is built (ValueError names what was wrong). No extension types."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_str_len=max_str, max_bin_len=max_bin,
                               max_array_len=max_array, max_map_len=max_map, max_ext_len=0)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - msgpack's other errors (TypeError for a bad map key, ...)
        raise ValueError(f"{type(e).__name__}: {e}") from None
