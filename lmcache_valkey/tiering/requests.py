"""tierd's requests, checked before anything acts on them (docs/security.md, "tierd").

Workers of one tenant push requests to that tenant's request list, and tierd runs with an
account at least as wide as the tenant's. Every request is therefore untrusted input, and
this module is the one place that turns its bytes into a typed :class:`Request`:

- sizes first: a message longer than :data:`MAX_REQUEST_BYTES`, a list longer than
  :data:`MAX_KEYS`, a key longer than the key schema allows, a number outside its range is
  refused before anything is allocated for it;
- types: every field has one type (keys are msgpack ``bin``, the op and tier are ``str``,
  counts are ``int``); nothing is coerced (``bytes(1200000000)`` would allocate 1.2 GB);
- confinement: every data key, evict prefix and reply list must lie inside tierd's own
  tenant (``<key prefix>:<tenant>:``), with every segment checked against the key grammar, so
  a request can never make tierd read, copy, evict or delete another tenant's chunks or write
  to another tenant's reply list (a confused deputy).

The server side of the protocol (:mod:`.service`) calls :func:`parse_request` once per
message, with its op table (``service.OPS``: each op's check of its own fields is one of the
``check_*`` functions here), and acts only on what it returns; a :class:`BadRequest` carries
the reply list and id when those were valid, so the sender still gets an error reply.

Never imports: a transport, aiobotocore, the store, the integrations.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..keys import SEGMENT_RE, parse_data_key
from . import protocol

MAX_REQUEST_BYTES = 4 << 20  # a full hint batch (16384 keys of ~90 bytes) is ~1.6 MiB
MAX_KEYS = 16384  # keys (or hints) in one request: the worker's hint buffer bound
MAX_ID = (1 << 63) - 1
MAX_TTL_MS = 3600_000  # a request's time to live; drains are bounded by it too
MAX_NBYTES = 1 << 40  # a put hint's value size
MAX_FIELDS = 16
MAX_REASON = 200  # characters of a refusal reason (logged and replied)
TIERS = ("ram", "nvme", "s3")
DEFAULT_TTL_MS = 1000


class BadRequest(ValueError):
    """A request tierd refuses. ``reply``/``id``: where to send the error, when known."""

    def __init__(self, reason: str, *, reply: bytes | None = None, id: int | None = None) -> None:
        super().__init__(reason[:MAX_REASON])
        self.reason = reason[:MAX_REASON]
        self.reply = reply
        self.id = id


@dataclass(frozen=True)
class Request:
    """One checked request. Only the fields of its op are set."""

    op: str
    id: int | None = None
    reply: bytes | None = None  # the sender's reply list (inside the tenant); None: no answer
    ttl_ms: int = DEFAULT_TTL_MS  # what is left of it when tierd took the request
    key: bytes | None = None  # promote
    keys: tuple[bytes, ...] | None = None  # evict, delete
    prefix: bytes | None = None  # evict
    tier: str | None = None  # evict
    timeout_s: float | None = None  # drain
    puts: tuple[tuple[bytes, int], ...] = ()  # hint: (data key, value bytes)
    hits: tuple[bytes, ...] = ()  # hint
    misses: tuple[bytes, ...] = ()  # hint: a lookup missed them
    leases: tuple[tuple[bytes, int], ...] = ()  # hint: (data key, milliseconds)
    releases: tuple[bytes, ...] = ()  # hint


class TenantScope:
    """What one tierd may touch: the data keys, prefixes and reply lists of its tenant."""

    def __init__(self, key_prefix: str, tenant: str) -> None:
        self.key_prefix = key_prefix
        self.tenant = tenant
        self.base = f"{key_prefix}:{tenant}:".encode()
        self._reply = re.compile(re.escape(protocol.reply_key(key_prefix, tenant, "")) + rb"[A-Za-z0-9_-]{1,64}")

    def owns(self, key: Any) -> bool:
        """``key`` is a data key of this tenant, every segment well formed."""
        try:
            d = parse_data_key(key)
        except (ValueError, TypeError):
            return False
        return d.prefix == self.key_prefix and d.tenant == self.tenant

    def data_key(self, v: Any, what: str) -> bytes:
        if not isinstance(v, bytes):
            raise BadRequest(f"{what}: a data key (msgpack bin) expected, got {_kind(v)}")
        if not self.owns(v):
            raise BadRequest(f"{what}: {_show(v)} is not a data key of tenant {self.tenant!r}")
        return v

    def evict_prefix(self, v: Any) -> bytes:
        """``<prefix>:<tenant>:`` (every chunk of the tenant) or ``<prefix>:<tenant>:<ns>:c:``."""
        if not isinstance(v, bytes):
            raise BadRequest(f"prefix: bytes expected, got {_kind(v)}")
        rest = v[len(self.base):] if v.startswith(self.base) else None
        ok = rest == b"" or (rest is not None and rest.endswith(b":c:") and rest.count(b":") == 2
                             and SEGMENT_RE.match(rest[:-3].decode("ascii", "replace")) is not None)
        if not ok:
            raise BadRequest(f"prefix: {_show(v)} is not a namespace prefix of tenant {self.tenant!r}")
        return v

    def reply_key(self, v: Any) -> bytes:
        if not isinstance(v, bytes) or self._reply.fullmatch(v) is None:
            raise BadRequest(f"reply: {_show(v)} is not a reply list of tenant {self.tenant!r}")
        return v


class RateLimitedLog:
    """One WARNING per ``interval_s`` at most, naming how many were not logged since: a
    tenant flooding its request list with bad requests cannot flood tierd's log."""

    def __init__(self, logger: logging.Logger, what: str, interval_s: float = 10.0) -> None:
        self.logger, self.what, self.interval_s = logger, what, interval_s
        self._last = -math.inf
        self._quiet = 0

    def note(self, reason: str) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._quiet += 1
            return
        more = f" ({self._quiet} more since the last report)" if self._quiet else ""
        self.logger.warning("%s: %s%s", self.what, reason, more)
        self._last, self._quiet = now, 0


def _kind(v: Any) -> str:
    return type(v).__name__


def _show(v: Any) -> str:
    """A bounded rendering of a refused value (it may be megabytes long)."""
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _int(v: Any, what: str, lo: int, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise BadRequest(f"{what}: an integer in [{lo}, {hi}] expected, got {_show(v) if type(v) is int else _kind(v)}")
    return v


def _list(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise BadRequest(f"{what}: a list expected, got {_kind(v)}")
    if len(v) > MAX_KEYS:
        raise BadRequest(f"{what}: at most {MAX_KEYS} entries, got {len(v)}")
    return v


def _keys(scope: TenantScope, v: Any, what: str) -> tuple[bytes, ...]:
    return tuple(scope.data_key(k, f"{what}[{i}]") for i, k in enumerate(_list(v, what)))


# --- each op's own fields (service.OPS names the check of each op) ---------------------------
def _pairs(scope: TenantScope, v: Any, what: str, unit: str, hi: int) -> tuple[tuple[bytes, int], ...]:
    """``[[data key, int in [0, hi]], ...]``."""
    out = []
    for i, p in enumerate(_list(v, what)):
        if not isinstance(p, list) or len(p) != 2:
            raise BadRequest(f"{what}[{i}]: a [data key, {unit}] pair expected")
        out.append((scope.data_key(p[0], f"{what}[{i}]"), _int(p[1], f"{what}[{i}] {unit}", 0, hi)))
    return tuple(out)


def check_hint(scope: TenantScope, m: dict[str, Any], ttl_ms: int) -> dict[str, Any]:
    puts = _pairs(scope, m.get("put", []), "put", "bytes", MAX_NBYTES)
    hits = _keys(scope, m.get("hit", []), "hit")
    misses = _keys(scope, m.get("miss", []), "miss")
    leases = _pairs(scope, m.get("lease", []), "lease", "milliseconds", MAX_TTL_MS)
    releases = _keys(scope, m.get("release", []), "release")
    if len(puts) + len(hits) + len(misses) + len(leases) + len(releases) > MAX_KEYS:
        raise BadRequest(f"hint: at most {MAX_KEYS} hints in one request")
    return {"puts": puts, "hits": hits, "misses": misses, "leases": leases, "releases": releases}


def check_promote(scope: TenantScope, m: dict[str, Any], ttl_ms: int) -> dict[str, Any]:
    return {"key": scope.data_key(m.get("key"), "key")}


def check_stats(scope: TenantScope, m: dict[str, Any], ttl_ms: int) -> dict[str, Any]:
    return {}


def check_evict(scope: TenantScope, m: dict[str, Any], ttl_ms: int) -> dict[str, Any]:
    tier = m.get("tier")
    if tier not in TIERS or not isinstance(tier, str):
        raise BadRequest(f"tier: one of {'|'.join(TIERS)} expected, got {_show(tier)}")
    if (m.get("keys") is None) == (m.get("prefix") is None):
        raise BadRequest("evict: exactly one of keys and prefix")
    if m.get("keys") is not None:
        return {"tier": tier, "keys": _keys(scope, m["keys"], "keys")}
    return {"tier": tier, "prefix": scope.evict_prefix(m["prefix"])}


def check_drain(scope: TenantScope, m: dict[str, Any], ttl_ms: int) -> dict[str, Any]:
    t = m.get("timeout_s", ttl_ms / 1000)
    if type(t) not in (int, float) or not math.isfinite(t) or not 0 < t <= MAX_TTL_MS / 1000:
        raise BadRequest(f"timeout_s: seconds in (0, {MAX_TTL_MS // 1000}] expected, got {_show(t)}")
    return {"timeout_s": float(t)}


def check_delete(scope: TenantScope, m: dict[str, Any], ttl_ms: int) -> dict[str, Any]:
    return {"keys": _keys(scope, m.get("keys"), "keys")}


def unpack(raw: Any) -> dict[str, Any]:
    """The message in ``raw``: bounded before anything is built for it, a msgpack map."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise BadRequest(f"a msgpack map expected, got {_kind(raw)}")
    if len(raw) > MAX_REQUEST_BYTES:
        raise BadRequest(f"{len(raw)} bytes: requests are at most {MAX_REQUEST_BYTES}")
    try:
        msg = protocol.unpack_bounded(bytes(raw), max_str=MAX_REASON, max_bin=MAX_REQUEST_BYTES,
                                      max_array=MAX_KEYS, max_map=MAX_FIELDS)
    except ValueError as e:
        raise BadRequest(f"not a msgpack message: {type(e).__name__}: {e}") from None
    if not isinstance(msg, dict):
        raise BadRequest(f"a msgpack map expected, got {_kind(msg)}")
    return msg


Check = Callable[[TenantScope, dict[str, Any], int], dict[str, Any]]


def parse_request(raw: Any, scope: TenantScope, checks: Mapping[str, Check], *, now_ms: int | None = None) -> Request:
    """The checked request in ``raw``, or :class:`BadRequest` naming what is wrong.
    ``checks``: op name -> the check of that op's own fields (the op table's).

    ``ttl_ms`` of the result is what is left of the sender's deadline: the time the request
    waited in the list (``sent_ms``) is taken off; clocks may differ, so never added."""
    msg = unpack(raw)
    reply = None if msg.get("reply") is None else scope.reply_key(msg["reply"])  # where an error would go
    rid = msg.get("id")
    try:
        rid = None if rid is None else _int(rid, "id", 0, MAX_ID)
    except BadRequest as e:
        raise BadRequest(e.reason, reply=reply) from None
    try:
        op = msg.get("op")
        if not isinstance(op, str) or op not in checks:
            raise BadRequest(f"op: one of {'|'.join(checks)} expected, got {_show(op)}")
        ttl_ms = _int(msg.get("ttl_ms", DEFAULT_TTL_MS), "ttl_ms", 1, MAX_TTL_MS)
        sent = msg.get("sent_ms")
        if sent is not None:
            sent = _int(sent, "sent_ms", 0, 1 << 53)
            waited = (int(time.time() * 1000) if now_ms is None else now_ms) - sent
            if waited > 0:
                ttl_ms -= waited
        body = checks[op](scope, msg, max(ttl_ms, 1))
    except BadRequest as e:
        raise BadRequest(e.reason, reply=reply, id=rid) from None
    return Request(op=op, id=rid, reply=reply, ttl_ms=ttl_ms, **body)


__all__ = ["BadRequest", "Check", "Request", "TenantScope", "RateLimitedLog", "parse_request", "MAX_REQUEST_BYTES",
           "MAX_KEYS", "check_delete", "check_drain", "check_evict", "check_hint", "check_promote", "check_stats"]
