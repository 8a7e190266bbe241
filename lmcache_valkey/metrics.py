"""Prometheus metrics for lmcache-valkey.

This is the only module that imports ``prometheus_client``. Everything else calls the plain
functions below with a small, closed set of label values (tiers, transports, operations,
causes); an unknown label value is recorded as ``other`` (and logged once) instead of raising,
so that a metrics call can never turn a hit into an error, and label cardinality stays bounded.
No key, namespace or tenant ever becomes a label.

Multi-process servers: when ``PROMETHEUS_MULTIPROC_DIR`` is set before ``prometheus_client`` is
first imported, every process writes its samples to that directory (vLLM creates one itself
only with ``--api-server-count`` > 1; with one API server the operator sets it, docs/metrics.md), gauges aggregate with the ``multiprocess_mode`` given below, and
:func:`render_latest` / :func:`start_http_server` collect all processes with a
``MultiProcessCollector``. Otherwise the metrics live in the default registry, so a host
process that already serves ``prometheus_client.REGISTRY`` (vLLM's ``/metrics``) exports them too.

Design note: docs/metrics.md. Never imports: anything else from this package.
"""

from __future__ import annotations

import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _multiprocess
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import values as _values

__all__ = [
    "ADMISSION_DECISIONS",
    "BREAKER_STATES",
    "CONTENT_TYPE_LATEST",
    "ERROR_CAUSES",
    "LATENCY_BUCKETS",
    "MISS_CAUSES",
    "OPS",
    "TIERS",
    "TRANSPORTS",
    "MetricsServer",
    "mark_process_dead",
    "multiprocess_dir",
    "multiprocess_enabled",
    "observe_latency",
    "record_admission",
    "record_demotion",
    "record_error",
    "record_flush_drop",
    "record_hit",
    "record_lookup",
    "record_miss",
    "record_promotion",
    "record_put",
    "render_latest",
    "sample_sum",
    "set_breaker_state",
    "set_flush_backlog",
    "set_lmcache_degraded",
    "set_registered_bytes",
    "set_tier_usage",
    "start_http_server",
]

log = logging.getLogger(__name__)

PREFIX = "lmcache_valkey"

# --- closed label sets -------------------------------------------------------------------
TIERS = ("ram", "nvme", "s3")
TRANSPORTS = ("resp", "fabric", "blob-tcp", "local")
# Why a chunk that was asked for did not arrive (errors.py ``cause`` / CorruptChunk ``reason``).
MISS_CAUSES = (
    "absent",  # not in this tier
    "deadline",  # past the operation's deadline
    "crc",  # CRC32C mismatch (bad copy deleted)
    "truncated",  # shorter than its header says
    "foreign",  # header belongs to another namespace
    "format",  # unknown wire-format version
    "layout",  # stored shapes/dtypes/format do not fit the reader's buffer (left in place)
    "meta",  # header metadata contradicts its payload or its namespace's layout (deleted)
    "connection",  # connection lost or refused
    "acl",  # NOPERM / auth
    "oversized",  # larger than the destination buffer
    "alloc",  # LMCache's CPU arena had no room for the destination
    "protocol",  # unexpected reply
    "io",  # local disk / object store I/O
    "fabric",  # libfabric transfer failed
    "nohello",  # fabric endpoint not introduced (HELLO) on this connection
    "noproof",  # fabric session did not prove the address it claims
    "region",  # fabric triple outside the regions declared at HELLO
    "window",  # fabric transfer window exhausted
    "unregistered",  # buffer outside the registered arena
    "error",  # anything else
)
ERROR_CAUSES = tuple(c for c in MISS_CAUSES if c != "absent") + (
    "oom",  # server refused a write (maxmemory)
    "overflow",  # bounded queue full
    "rejected",  # the object store refused a write for good (a permanent 4xx)
    "replicas",  # put_replicas: fewer replicas than asked acknowledged a put (WAIT)
)
OPS = (
    "lookup",
    "get",
    "put",
    "delete",
    "promote",
    "demote",
    "flush",
    "evict",
    "connect",
    "register",
    "scan",  # a SCAN walk listing keys (transport/scan.py)
)
BREAKER_STATES = {"closed": 0, "open": 1, "half_open": 2}
ADMISSION_DECISIONS = ("admitted", "rejected")
DEGRADED_REASONS = ("no_kv_connector", "hook_incompatible", "unsupported_config")
OTHER = "other"

# 100 µs .. 30 s, roughly 1-2.5-5 per decade.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# Prefix length of a lookup, in chunks.
PREFIX_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _label(kind: str, value: str, allowed) -> str:
    if value in allowed:
        return value
    key = (kind, str(value))
    with _warned_lock:
        first = key not in _warned
        if first:
            _warned.add(key)
    if first:
        log.warning("metrics: unknown %s label %r recorded as %r", kind, value, OTHER)
    return OTHER


def multiprocess_dir() -> Optional[str]:
    """The multiprocess directory from the environment, or None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")


def multiprocess_enabled() -> bool:
    """True when samples go to the multiprocess directory (decided at prometheus_client import)."""
    return getattr(_values, "ValueClass", None) is not getattr(_values, "MutexValue", object())


if multiprocess_dir() and not multiprocess_enabled():
    log.warning(
        "PROMETHEUS_MULTIPROC_DIR is set but prometheus_client was imported before it was; "
        "this process's metrics stay in-process and are not visible to a multiprocess scrape"
    )


# --- metric objects ------------------------------------------------------------------------
def _n(name: str) -> str:
    return f"{PREFIX}_{name}"


LOOKUPS = Counter(_n("lookups"), "Prefix lookups (batched_contains calls).")
LOOKUP_KEYS = Counter(_n("lookup_keys"), "Chunk keys asked about by lookups.")
LOOKUP_HIT_KEYS = Counter(
    _n("lookup_hit_keys"), "Chunk keys in the consecutive found prefix returned by lookups."
)
LOOKUP_PREFIX = Histogram(
    _n("lookup_prefix_chunks"),
    "Length of the found prefix per lookup, in chunks.",
    buckets=PREFIX_BUCKETS,
)
LOOKUP_SECONDS = Histogram(
    _n("lookup_duration_seconds"),
    "Wall time of one prefix lookup across all tiers.",
    buckets=LATENCY_BUCKETS,
)
HITS = Counter(_n("hits"), "Chunks retrieved, by the tier that served them.", ["tier", "transport"])
RETRIEVED_BYTES = Counter(
    _n("retrieved_bytes"), "Payload bytes retrieved, by serving tier.", ["tier", "transport"]
)
MISSES = Counter(_n("misses"), "Chunks asked for and not delivered, by cause.", ["tier", "cause"])
ERRORS = Counter(_n("errors"), "Failed operations, by cause.", ["op", "cause"])
LATENCY = Histogram(
    _n("operation_duration_seconds"),
    "Wall time of one operation on one tier.",
    ["op", "tier", "transport"],
    buckets=LATENCY_BUCKETS,
)
PUTS = Counter(_n("puts"), "Chunk writes, by tier and result.", ["tier", "transport", "result"])
STORED_BYTES = Counter(
    _n("stored_bytes"), "Payload bytes written successfully, by tier.", ["tier", "transport"]
)
FLUSH_BACKLOG = Gauge(
    _n("flush_backlog_chunks"),
    "Chunks queued for write-behind to a lower tier.",
    ["tier"],
    multiprocess_mode="livesum",
)
FLUSH_DROPS = Counter(
    _n("flush_dropped"), "Chunks dropped because the write-behind queue was full.", ["tier"]
)
PROMOTIONS = Counter(_n("promotions"), "Chunks promoted into RAM, by source tier.", ["from_tier"])
PROMOTED_BYTES = Counter(_n("promoted_bytes"), "Bytes promoted into RAM, by source tier.", ["from_tier"])
DEMOTIONS = Counter(_n("demotions"), "Chunks demoted out of RAM, by destination tier.", ["to_tier"])
DEMOTED_BYTES = Counter(_n("demoted_bytes"), "Bytes demoted, by destination tier.", ["to_tier"])
BREAKER_STATE = Gauge(
    _n("breaker_state"),
    "Circuit breaker per tier: 0 closed, 1 open, 2 half-open (max over processes).",
    ["tier"],
    multiprocess_mode="livemax",
)
REGISTERED_BYTES = Gauge(
    _n("fabric_registered_bytes"),
    "Host/GPU memory registered with libfabric.",
    multiprocess_mode="livesum",
)
ADMISSIONS = Counter(
    _n("admission_decisions"), "Admission policy decisions for a lower tier.", ["tier", "decision"]
)
FABRIC_FALLBACKS = Counter(
    _n("fabric_fallbacks"), "Fabric RMA transfers carried by the module's bulk (TCP) commands instead.", ["op"]
)
LMCACHE_DEGRADED = Gauge(
    _n("lmcache_degraded"),
    "1 while LMCache in this process runs without a KV connector and recomputes every request "
    "(no_kv_connector: LMCache has none for this platform; hook_incompatible: this LMCache is "
    "one lmcache-valkey cannot supply its CPU connector to; unsupported_config: an LMCache mode "
    "the CPU connector refuses).",
    ["reason"],
    multiprocess_mode="livemax",
)
TIER_USED = Gauge(
    _n("tier_used_bytes"), "Bytes held by a tier.", ["tier"], multiprocess_mode="mostrecent"
)
TIER_CAPACITY = Gauge(
    _n("tier_capacity_bytes"), "Byte budget of a tier.", ["tier"], multiprocess_mode="mostrecent"
)


# --- recording API ---------------------------------------------------------------------------
# Labelled children, looked up once: ``Metric.labels()`` validates and locks on every call,
# and a get or put records three to four samples per chunk. Every label value has been
# mapped into a fixed set first (_label), so this holds at most a few hundred entries.
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    key = (metric, *labels)
    child = _children.get(key)
    if child is None:  # (two threads may both get here: labels() returns the same child)
        child = _children[key] = metric.labels(*labels)
    return child


def record_lookup(keys: int, prefix: int, seconds: float) -> None:
    """One prefix lookup asked about ``keys`` chunks and found the first ``prefix``."""
    LOOKUPS.inc()
    if keys > 0:
        LOOKUP_KEYS.inc(keys)
    if prefix > 0:
        LOOKUP_HIT_KEYS.inc(prefix)
    LOOKUP_PREFIX.observe(max(prefix, 0))
    LOOKUP_SECONDS.observe(max(seconds, 0.0))


def record_hit(tier: str, transport: str, nbytes: int) -> None:
    """One chunk of ``nbytes`` payload bytes was delivered from ``tier`` over ``transport``."""
    t = _label("tier", tier, TIERS)
    tr = _label("transport", transport, TRANSPORTS)
    _child(HITS, t, tr).inc()
    if nbytes > 0:
        _child(RETRIEVED_BYTES, t, tr).inc(nbytes)


def record_miss(tier: str, cause: str) -> None:
    """One chunk asked of ``tier`` was not delivered; ``cause`` is one of MISS_CAUSES."""
    _child(MISSES, _label("tier", tier, TIERS), _label("cause", cause, MISS_CAUSES)).inc()


def record_error(op: str, cause: str) -> None:
    """One operation ``op`` (OPS) failed with ``cause`` (ERROR_CAUSES)."""
    _child(ERRORS, _label("op", op, OPS), _label("cause", cause, ERROR_CAUSES)).inc()


def observe_latency(op: str, tier: str, transport: str, seconds: float) -> None:
    """Wall time of one ``op`` on ``tier`` over ``transport``."""
    _child(
        LATENCY, _label("op", op, OPS), _label("tier", tier, TIERS), _label("transport", transport, TRANSPORTS)
    ).observe(max(seconds, 0.0))


def record_put(tier: str, transport: str, nbytes: int, ok: bool) -> None:
    """One chunk write to ``tier``; bytes count only when ``ok``."""
    t = _label("tier", tier, TIERS)
    tr = _label("transport", transport, TRANSPORTS)
    _child(PUTS, t, tr, "ok" if ok else "failed").inc()
    if ok and nbytes > 0:
        _child(STORED_BYTES, t, tr).inc(nbytes)


def set_flush_backlog(tier: str, n: int) -> None:
    """Chunks currently queued for write-behind to ``tier``."""
    _child(FLUSH_BACKLOG, _label("tier", tier, TIERS)).set(n)


def record_flush_drop(tier: str, n: int = 1) -> None:
    """``n`` chunks bound for ``tier`` were dropped because the queue was full."""
    _child(FLUSH_DROPS, _label("tier", tier, TIERS)).inc(n)


def record_promotion(src_tier: str, nbytes: int = 0) -> None:
    """One chunk was promoted into RAM from ``src_tier``."""
    t = _label("tier", src_tier, TIERS)
    _child(PROMOTIONS, t).inc()
    if nbytes > 0:
        _child(PROMOTED_BYTES, t).inc(nbytes)


def record_demotion(dst_tier: str, nbytes: int = 0) -> None:
    """One chunk was demoted (copied or moved) to ``dst_tier``."""
    t = _label("tier", dst_tier, TIERS)
    _child(DEMOTIONS, t).inc()
    if nbytes > 0:
        _child(DEMOTED_BYTES, t).inc(nbytes)


def set_breaker_state(tier: str, state: str) -> None:
    """Circuit breaker of ``tier`` is now ``state`` (closed / open / half_open)."""
    value = BREAKER_STATES.get(state)
    if value is None:
        _label("breaker state", state, BREAKER_STATES)
        value = BREAKER_STATES["open"]
    _child(BREAKER_STATE, _label("tier", tier, TIERS)).set(value)


def set_registered_bytes(n: int) -> None:
    """Bytes this process has registered with libfabric."""
    REGISTERED_BYTES.set(n)


def set_lmcache_degraded(reason: str, degraded: bool) -> None:
    """LMCache in this process runs (or no longer runs) without a KV connector, for ``reason``."""
    _child(LMCACHE_DEGRADED, _label("degraded reason", reason, DEGRADED_REASONS)).set(1 if degraded else 0)


def record_admission(tier: str, admitted: bool) -> None:
    """The admission policy for ``tier`` admitted or rejected one chunk."""
    _child(ADMISSIONS, _label("tier", tier, TIERS), "admitted" if admitted else "rejected").inc()


def record_fabric_fallback(op: str) -> None:
    """A fabric ``get``/``put`` fell back from RMA to the module's bulk commands."""
    _child(FABRIC_FALLBACKS, _label("op", op, OPS)).inc()


def set_tier_usage(tier: str, used_bytes: int, capacity_bytes: Optional[int] = None) -> None:
    """Bytes held by ``tier`` and, if known, its budget."""
    t = _label("tier", tier, TIERS)
    _child(TIER_USED, t).set(used_bytes)
    if capacity_bytes is not None:
        _child(TIER_CAPACITY, t).set(capacity_bytes)


# --- exposition ------------------------------------------------------------------------------
def sample_sum(exposition: str, name: str, labels: Optional[dict[str, str]] = None) -> float:
    """Sum of the samples named ``name`` in a text exposition (a scraped ``/metrics``) whose
    labels include ``labels``; 0 when there are none."""
    want = labels or {}
    total = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in want.items()):
                total += sample.value
    return total


def _collecting_registry() -> CollectorRegistry:
    # Decided by where samples really go, not by the variable alone: LMCache sets
    # PROMETHEUS_MULTIPROC_DIR itself after prometheus_client was imported.
    if multiprocess_dir() and multiprocess_enabled():
        registry = CollectorRegistry()
        _multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


def render_latest() -> bytes:
    """The text exposition of every metric (all processes in multiprocess mode)."""
    return generate_latest(_collecting_registry())


def mark_process_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (multiprocess mode; no-op otherwise)."""
    path = multiprocess_dir()
    if path:
        _multiprocess.mark_process_dead(pid, path)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class MetricsServer:
    """A small HTTP server: ``/metrics`` (Prometheus text) and ``/healthz``.

    ``health`` returns True when healthy; ``/healthz`` answers 200 ``ok`` or 503 ``unhealthy``.
    ``port=0`` picks a free port; read it back from :attr:`port`. Stop with :meth:`close`.
    """

    def __init__(self, port: int, addr: str = "0.0.0.0", health: Optional[Callable[[], bool]] = None):
        outer = self
        self._health = health

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    try:
                        body, ctype, code = render_latest(), CONTENT_TYPE_LATEST, 200
                    except Exception as exc:  # a scrape must not kill the server
                        log.exception("metrics: render failed")
                        body, ctype, code = f"render failed: {exc}\n".encode(), "text/plain", 500
                elif path == "/healthz":
                    ok = outer._healthy()
                    body, ctype, code = (b"ok\n" if ok else b"unhealthy\n"), "text/plain", (200 if ok else 503)
                else:
                    body, ctype, code = b"not found: try /metrics or /healthz\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args) -> None:
                log.debug("metrics http: " + fmt, *args)

        self._server = _Server((addr, port), Handler)
        self.addr = addr
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lmcache-valkey-metrics", daemon=True
        )
        self._thread.start()

    def _healthy(self) -> bool:
        if self._health is None:
            return True
        try:
            return bool(self._health())
        except Exception:
            log.exception("metrics: health check raised")
            return False

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_http_server(
    port: int, addr: str = "0.0.0.0", health: Optional[Callable[[], bool]] = None
) -> MetricsServer:
    """Serve ``/metrics`` and ``/healthz`` on ``addr:port`` from a daemon thread."""
    return MetricsServer(port, addr, health)
