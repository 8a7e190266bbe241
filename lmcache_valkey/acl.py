"""The Valkey ACL lines this project recommends, and how to tell a user that can do more.

Four principals (docs/security.md): a tenant's **workers**, that tenant's **tierd**,
**operators**, and the chart's **Valkey exporter** sidecar (a monitoring user). A worker's and a tierd's line is an allow-list of exactly the commands that
principal sends (``tests/security/test_acl.py`` runs the plugin, the worker's tier client
and tierd under these lines with ``MONITOR`` on and compares), confined to the tenant's keys
(``~<prefix>:<tenant>:*``) and to no Pub/Sub channel. Whatever the line does not name is
refused with ``NOPERM``: keyspace-wide reads (``KEYS``, ``SCAN``, ``RANDOMKEY``, ``DBSIZE``,
``INFO``), server-wide writes (``FLUSHALL``, ``FLUSHDB``, ``SWAPDB``, ``RESTORE``,
``CONFIG``), other clients (``CLIENT LIST/KILL/PAUSE``, ``MONITOR``) and administration.

The chart's NOTES, ``configs/multi-tenant.yaml`` and the docs print these lines; ``doctor``
prints them as the fix and uses :data:`PROBES` to warn about a user that can run more.

Pure data and pure functions: the doctor does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What a worker sends (RESP transport): reads, writes and lookups of its chunks, PING.
WORKER = ("get", "set", "getrange", "exists", "unlink", "ping")
# ... with tiering in the service placement (docs/tiering-promotion.md): the request list,
# its reply list and the delete-intent hash.
WORKER_TIERING = ("rpush", "ltrim", "blpop", "hset")
# What tierd sends: chunk values and tier markers (GET/SET/PTTL/EXISTS/UNLINK), the demotion
# pass (its own index of RAM chunks and of markers, ZADD/ZRANGE/ZREM; OBJECT IDLETIME; INFO
# memory), the request and reply lists (BLPOP/LPOP/RPUSH/PEXPIRE; a reply's RPUSH+PEXPIRE in
# one MULTI/EXEC) and delete intents. No
# SCAN/KEYS/RANDOMKEY (a SCAN reply lists every tenant's key names: ACL key patterns do not
# filter it) and no EVAL/FUNCTION (a script may run forever and make every client wait):
# docs/tiering-index.md.
TIERD = ("get", "set", "pttl", "exists", "unlink", "zadd", "zrange", "zrem", "object|idletime", "info", "blpop",
         "lpop", "rpush", "pexpire", "multi", "exec", "hkeys", "hset", "hdel")
# ... with ``put_replicas`` (docs/cluster.md): WAIT after each SET. It names no key; what it
# tells a tenant is how many replicas have that tenant's own connection's writes.
WORKER_DURABLE = ("wait",)
# Valkey Cluster: the slot map and ASK redirections.
CLUSTER = ("cluster|slots", "asking")
# The fabric and blob-tcp transports (docs/fabric-acl.md): the large-object commands by name
# (every server; Valkey 9.1 also takes their category, +@largeobj) and PEXPIRE (a TTL against
# a server without our PX option). They delete with UNLINK, as WORKER.
FABRIC = ("blob.rdma_hello", "blob.rdma_prove", "blob.rdma_set", "blob.rdma_get", "blob.tcp_set", "blob.tcp_get",
          "blob.info", "pexpire")
# ... with ``fabric_dialect: dma`` (docs/fabric-dma-dialect.md): Momento's commands (our
# DMA.PROVE only where the module has it) and PEXPIRE; its bulk path is WORKER's GET/SET.
FABRIC_DMA = ("dma.hello", "dma.prove", "dma.set", "dma.get", "pexpire")

# What the chart's Valkey exporter sidecar (redis_exporter) needs: INFO ALL for every series it
# exports, CLIENT SETNAME, LATENCY LATEST, SLOWLOG LEN; CLUSTER INFO in a cluster. No key (it may not
# list or read keys: its `check-keys` can be switched on by anyone who reaches its HTTP port,
# through `/scrape?check-keys=...`), no SLOWLOG (other tenants' commands and key names), no
# CONFIG GET (it returns `masterauth`, the operators' password): its credential is handed to
# whatever address a `/scrape?target=` request names, so it must be worth nothing.
MONITOR = ("info", "client|setname", "latency|latest", "slowlog|len")
MONITOR_CLUSTER = ("cluster|info",)
# What the exporter sends that its line refuses on purpose (it logs the refusal once and
# carries on): `CONFIG GET *`, `SLOWLOG GET 1`.
MONITOR_REFUSED = ("config|get", "slowlog|get")


def _line(user: str, password: str, prefix: str, tenant: str, commands: tuple[str, ...]) -> str:
    allow = " ".join(f"+{c}" for c in commands)
    return f"user {user} on >{password} resetkeys resetchannels ~{prefix}:{tenant}:* -@all {allow}"


def worker_commands(*, cluster: bool = False, tiering: bool = False, fabric: bool = False, db: int = 0,
                    fabric_dialect: str = "large-object", durable: bool = False) -> tuple[str, ...]:
    fab = (FABRIC_DMA if fabric_dialect == "dma" else FABRIC) if fabric else ()
    return (WORKER + (WORKER_TIERING if tiering else ()) + (WORKER_DURABLE if durable else ()) + fab
            + (CLUSTER if cluster else ()) + (("select",) if db else ()))


def tierd_commands(*, cluster: bool = False, db: int = 0) -> tuple[str, ...]:
    return TIERD + (CLUSTER if cluster else ()) + (("select",) if db else ())


def worker_line(user: str, tenant: str, *, prefix: str = "lmcv", password: str = "PASSWORD",
                cluster: bool = False, tiering: bool = False, fabric: bool = False, db: int = 0,
                fabric_dialect: str = "large-object", durable: bool = False) -> str:
    """The ACL file line for a tenant's workers (``tiering``: with a tierd to talk to;
    ``fabric``: with the RMA transport, in ``fabric_dialect``; ``durable``: with
    ``put_replicas``)."""
    return _line(user, password, prefix, tenant,
                 worker_commands(cluster=cluster, tiering=tiering, fabric=fabric, db=db, fabric_dialect=fabric_dialect,
                                 durable=durable))


def tierd_line(user: str, tenant: str, *, prefix: str = "lmcv", password: str = "PASSWORD",
               cluster: bool = False, db: int = 0) -> str:
    """The ACL file line for the tierd that serves ``tenant`` (never wider than the tenant)."""
    return _line(user, password, prefix, tenant, tierd_commands(cluster=cluster, db=db))


def monitor_commands(*, cluster: bool = False) -> tuple[str, ...]:
    return MONITOR + (MONITOR_CLUSTER if cluster else ())


def monitor_line(user: str = "lmcv-monitor", *, password: str = "MONITOR_PASSWORD", cluster: bool = False) -> str:
    """The Valkey exporter's user: server statistics only, no key, no channel."""
    allow = " ".join(f"+{c}" for c in monitor_commands(cluster=cluster))
    return f"user {user} on >{password} resetkeys resetchannels -@all {allow}"


def operator_line(user: str = "lmcv-ops", *, password: str = "PASSWORD") -> str:
    """Operators (the chart's probes, replication, cluster Job; people): everything."""
    return f"user {user} on >{password} ~* &* +@all"


# --- telling a user that can do more ---------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """A command a worker's user must not be able to run. ``args`` are harmless where the
    command is allowed (a syntax or range error, a no-op), so that ``direct`` probes may run
    it; the others are only ever queued in a transaction that is discarded, or asked about
    with ``ACL DRYRUN``."""

    name: str
    args: tuple[str, ...]
    why: str
    direct: bool = True


PROBE_KEY = "{tenant_key}"  # replaced by a key inside the tenant's pattern
PROBES: tuple[Probe, ...] = (
    Probe("FLUSHALL", ("FLUSHALL", "LMCV-DOCTOR", "PROBE"), "wipes every tenant's chunks"),
    Probe("FLUSHDB", ("FLUSHDB", "LMCV-DOCTOR", "PROBE"), "wipes every tenant's chunks"),
    Probe("SWAPDB", ("SWAPDB", "lmcv-doctor", "probe"), "swaps every tenant's data"),
    Probe("RESTORE", ("RESTORE", PROBE_KEY, "0", "\x00"), "loads crafted serialized values"),
    Probe("CONFIG SET", ("CONFIG", "SET", "lmcv-doctor-probe", "x"), "reconfigures the server"),
    Probe("KEYS", ("KEYS", "lmcv-doctor-probe:*"), "lists every tenant's keys", direct=False),
    Probe("SCAN", ("SCAN", "0", "MATCH", "lmcv-doctor-probe:*", "COUNT", "1"), "lists every tenant's keys"),
    Probe("RANDOMKEY", ("RANDOMKEY",), "reveals other tenants' keys"),
    Probe("DBSIZE", ("DBSIZE",), "counts every tenant's keys"),
    Probe("CLIENT LIST", ("CLIENT", "LIST", "ID", "0"), "shows other clients and their commands"),
    Probe("CLIENT KILL", ("CLIENT", "KILL", "ID", "0"), "disconnects other tenants"),
    Probe("CLIENT PAUSE", ("CLIENT", "PAUSE", "lmcv-doctor-probe"), "stops every client"),
    Probe("MONITOR", ("MONITOR",), "reads every tenant's commands", direct=False),
    Probe("SHUTDOWN", ("SHUTDOWN",), "stops the server", direct=False),
    Probe("ACL", ("ACL", "USERS"), "administers users"),
)


ALLOWED, DENIED, UNKNOWN = "allowed", "denied", "unknown"


def classify(reply: Any, *, dryrun: bool = False) -> str:
    """What one probe's reply says: ``allowed``, ``denied`` (NOPERM) or ``unknown`` (the
    server does not know the command, or refused it before looking at the ACL).

    ``reply`` is the decoded reply, or the exception a command raised. Queued in MULTI an
    allowed command answers ``QUEUED``; run directly, its harmless arguments make it answer
    an error of its own, which still means the ACL let it through. ``ACL DRYRUN`` answers
    ``OK`` or, when refused, a text naming the missing permission."""
    if isinstance(reply, BaseException):
        msg = str(getattr(reply, "message", reply))
        code = msg.split(" ", 1)[0]
        if code == "NOPERM" or "no permissions" in msg:
            return DENIED
        low = msg.lower()
        if "unknown command" in low or "unknown subcommand" in low or "not allowed inside a transaction" in low:
            return UNKNOWN
        return ALLOWED  # its own error: past the ACL check (a MOVED/ASK too)
    if dryrun:
        return ALLOWED if reply in (b"OK", "OK") else DENIED
    return ALLOWED


__all__ = ["WORKER", "WORKER_TIERING", "TIERD", "CLUSTER", "FABRIC", "MONITOR", "MONITOR_CLUSTER", "MONITOR_REFUSED",
           "worker_line", "tierd_line", "operator_line", "monitor_line", "monitor_commands",
           "worker_commands", "tierd_commands", "Probe", "PROBES", "PROBE_KEY", "classify",
           "ALLOWED", "DENIED", "UNKNOWN"]
