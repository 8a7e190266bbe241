"""``lmcache-valkey tierd``: the tier manager as a service next to Valkey, and CLI controls.

The CLI calls :func:`add_tierd_arguments` on its ``tierd`` sub-parser and runs
``asyncio.run(run_tierd(args))``: a :class:`~.manager.TierManager` whose
:class:`~.service.RequestServer` consumes the tenant's request list. Control sub-commands call
:func:`tier_stats`, :func:`evict` and :func:`drain`, which reach a running ``tierd`` through
Valkey (the same request list workers use, docs/tiering-promotion.md) or an in-process manager.

SIGTERM/SIGINT: stop taking requests, drain the object-tier backlog for at most
``--drain-timeout-s``, report what was left (counted as drops), exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from .. import metrics
from ..config import Settings
from ..errors import ConfigError
from ..settings import load_settings
from .client import EmbeddedTierClient, RemoteTierClient
from .manager import TierManager
from .service import RequestServer
from .settings import TieringSettings

log = logging.getLogger(__name__)

EXIT_UNFLUSHED = 3  # stopped with chunks the drain could not flush (counted as drops); the CLI documents it


def add_tierd_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = parser
    p.add_argument("--valkey-url", required=True, help="valkey://host:port (the Valkey this tierd serves)")
    p.add_argument("--tenant", default="default", help="tenant whose chunks this tierd manages")
    p.add_argument("--key-prefix", default="lmcv", help="key prefix (Settings.key_prefix)")
    p.add_argument("--nvme-dir", default=None, help="directory on NVMe for the warm tier")
    p.add_argument("--nvme-budget-bytes", default="64GiB", help="byte budget of the NVMe tier (e.g. 500GiB)")
    p.add_argument("--s3-bucket", default=None, help="bucket of the cold tier (omit: no object tier)")
    p.add_argument("--s3-prefix", default="lmcache-valkey", help="object key prefix; the tenant is added")
    p.add_argument("--s3-endpoint-url", default=None, help="endpoint of an S3-compatible store")
    p.add_argument("--s3-region", default=None)
    p.add_argument("--flush-queue-max", default=1024, type=int, help="write-behind queue bound (chunks)")
    p.add_argument("--admission", default="second_touch", help="always | second_touch | frequency")
    p.add_argument("--recompute-budget-s", default=2.0, type=float)
    p.add_argument("--metrics-port", default=None, type=int, help="serve /metrics and /healthz on this port")
    p.add_argument("--drain-timeout-s", default=30.0, type=float, help="bound on draining the backlog at SIGTERM")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other setting (repeatable), e.g. --set demote_idle_s=600")
    return p


# setting -> the tierd flag that sets it (every other setting comes from --set KEY=VALUE)
_FLAG_OF_KEY = {"url": "--valkey-url", "tenant": "--tenant", "key_prefix": "--key-prefix",
                "nvme_dir": "--nvme-dir", "nvme_budget_bytes": "--nvme-budget-bytes", "s3_bucket": "--s3-bucket",
                "s3_prefix": "--s3-prefix", "s3_endpoint_url": "--s3-endpoint-url", "s3_region": "--s3-region",
                "flush_queue_max": "--flush-queue-max", "admission": "--admission",
                "recompute_budget_s": "--recompute-budget-s"}


def settings_from_tierd_args(args: argparse.Namespace) -> tuple[Settings, TieringSettings]:
    """tierd's settings from its flags, through the one entry point every component uses
    (``lmcache_valkey.settings.load_settings``); ``--set KEY=VALUE`` takes any other key. A
    bad value is named as the user wrote it: the flag, or ``--set KEY``."""
    raw: dict[str, Any] = {"url": args.valkey_url, "tenant": args.tenant, "key_prefix": args.key_prefix,
                           "tiering": "service", "nvme_budget_bytes": args.nvme_budget_bytes,
                           "s3_prefix": args.s3_prefix, "flush_queue_max": args.flush_queue_max,
                           "admission": args.admission, "recompute_budget_s": args.recompute_budget_s}
    for k in ("nvme_dir", "s3_bucket", "s3_endpoint_url", "s3_region"):
        if getattr(args, k, None):
            raw[k] = getattr(args, k)
    named = dict(_FLAG_OF_KEY)
    for kv in args.set:
        k, eq, v = kv.partition("=")
        if not eq or not k.strip():
            # (not quoted: "--set password:S3CRET" is a slip that holds the secret)
            raise ConfigError("--set", "KEY=VALUE (e.g. --set demote_idle_s=600)")
        raw[k.strip()] = v.strip()
        named[k.strip()] = f"--set {k.strip()}"
    try:
        settings, ts = load_settings(raw)
    except ConfigError as e:
        key, _, rest = e.key.partition("?")  # url?<key>: a setting in the URL's query string
        where = named.get(key, key) + (f" (?{rest})" if rest else "")
        raise e.renamed(where) from None
    if ts.nvme_dir is None and ts.s3_bucket is None:
        raise ConfigError("--nvme-dir", "--nvme-dir and/or --s3-bucket (tierd needs a tier to manage)")
    return settings, ts


async def run_tierd(args: argparse.Namespace, *, ready: asyncio.Event | None = None,
                    stop: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or ``stop``). Returns the process exit status."""
    from ..transport.resp import RespClient

    if not logging.getLogger().handlers:  # a service logs to stderr unless the host configured logging
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    settings, ts = settings_from_tierd_args(args)
    valkey = RespClient(replace(settings, connections_per_node=max(settings.connections_per_node, 8)))
    await valkey.start()
    manager = TierManager(settings, ts, valkey)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    metrics_server = None
    closed = False
    try:
        await manager.start()
        if args.metrics_port is not None:
            metrics_server = metrics.start_http_server(args.metrics_port, health=lambda: not stop.is_set())
        log.info("tierd: serving tenant %s on %s", args.tenant, settings.url_for_humans)
        if ready is not None:
            ready.set()
        server = asyncio.create_task(RequestServer(manager).serve(stop))
        await stop.wait()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        log.info("tierd: stopping; draining the flush backlog (<= %.1fs)", args.drain_timeout_s)
        closed = True
        left = await manager.close(args.drain_timeout_s)
        if left:
            log.warning("tierd: %d chunk(s) were not flushed to the object tier", left)
        return 0 if not left else EXIT_UNFLUSHED
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if metrics_server is not None:
            metrics_server.close()
        if not closed:
            await manager.close(0.0)
        await valkey.close()


# --- controls for the CLI --------------------------------------------------------------------
async def _control(target: Any, op: str, args: dict[str, Any], timeout: float) -> Any:
    if isinstance(target, TierManager):
        target = EmbeddedTierClient(target)
    if not isinstance(target, (EmbeddedTierClient, RemoteTierClient)):
        raise TypeError("target must be a tier client or a TierManager")
    return await target.control(op, args, timeout=timeout)


async def tier_stats(target: Any, *, timeout: float = 10.0) -> dict[str, Any]:
    """Per-tier stats of a tierd (a ``RemoteTierClient``) or an in-process manager."""
    return await _control(target, "stats", {}, timeout)


async def evict(target: Any, tier: str, *, keys: Sequence[bytes] | None = None,
                namespace: str | None = None, key_prefix: str = "lmcv", tenant: str = "default",
                timeout: float = 60.0) -> int:
    """Remove copies from one tier (ram | nvme | s3): the given data keys, or every chunk of a
    namespace (its digest, as in ``<prefix>:<tenant>:<digest>:c:{id}``)."""
    args: dict[str, Any] = {"tier": tier}
    if keys is not None:
        args["keys"] = list(keys)
    elif namespace is not None:
        args["prefix"] = f"{key_prefix}:{tenant}:{namespace}:c:".encode()
    else:
        raise ValueError("evict needs keys or a namespace")
    return int(await _control(target, "evict", args, timeout))


@dataclass(frozen=True)
class DrainReport:
    """What a ``drain`` could not flush. True (``drained``) only when the backlog is empty
    and no upload was dropped since the previous drain (each drop is reported once)."""

    drained: bool
    backlog: int = 0  # chunks still queued for the object store (down, slow)
    dropped: int = 0  # chunks given up since the previous drain: queue full, refused, retries exhausted
    tiers: dict[str, Any] = field(default_factory=dict)  # per write-behind tier: backlog, dropped, breaker

    def __bool__(self) -> bool:
        return self.drained

    @classmethod
    def from_result(cls, r: Any) -> "DrainReport":
        if isinstance(r, dict):  # a bare bool: a tierd from before the report (backlog only)
            return cls(bool(r.get("drained")), int(r.get("backlog") or 0), int(r.get("dropped") or 0),
                       dict(r.get("tiers") or {}))
        return cls(bool(r))

    def describe(self, timeout: float) -> str:
        if self.drained:
            return "flush backlog drained"
        parts = []
        if self.dropped:
            parts.append(f"{self.dropped} chunk(s) dropped instead of flushed (not in the object store; "
                         "they stay in RAM/NVMe only: see tierd's log)")
        if self.backlog:
            parts.append(f"{self.backlog} chunk(s) still queued")
        breakers = [f"{n}: breaker {t.get('breaker')}" for n, t in self.tiers.items()
                    if t.get("breaker") not in (None, "closed")]
        if self.backlog or not self.dropped:
            parts.append(f"flush backlog NOT drained within {timeout:g}s (tierd keeps flushing; run drain again)")
        return "NOT flushed: " + "; ".join(parts + breakers)


async def drain(target: Any, *, timeout: float = 60.0) -> DrainReport:
    """Wait until the flush backlog is empty or ``timeout`` passes; report what could not be
    flushed (a :class:`DrainReport`, true when everything was)."""
    return DrainReport.from_result(await _control(target, "drain", {"timeout_s": timeout}, timeout + 5.0))


# --- argparse glue for the CLI's control sub-commands (stats, evict, drain) --------------------
def _add_control_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--valkey-url", "--url", dest="valkey_url", required=True,
                   help="valkey://host:port of the Valkey that tierd serves")
    p.add_argument("--tenant", default="default")
    p.add_argument("--key-prefix", default="lmcv")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for tierd's answer")
    if not any(a.dest == "json" for a in p._actions):
        p.add_argument("--json", action="store_true", help="machine-readable output")


def add_stats_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _add_control_arguments(p)
    return p


def add_evict_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _add_control_arguments(p)
    p.add_argument("--tier", required=True, choices=("ram", "nvme", "s3"))
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--namespace", help="namespace digest (the third segment of a data key)")
    g.add_argument("--key", action="append", help="a data key, e.g. 'lmcv:t1:<ns>:c:{<id>}' (repeatable)")
    return p


def add_drain_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _add_control_arguments(p)
    return p


async def with_remote(args: argparse.Namespace, fn) -> Any:
    """Run ``fn(client)`` with a remote tier client for the CLI's connection flags."""
    from ..transport.resp import RespClient

    settings, _ = load_settings({"url": args.valkey_url, "tenant": args.tenant, "key_prefix": args.key_prefix})
    valkey = RespClient(settings)
    await valkey.start()
    tc = RemoteTierClient(valkey, settings)
    try:
        return await fn(tc)
    finally:
        await tc.close()
        await valkey.close()


async def tier_stats_command(args: argparse.Namespace) -> dict[str, Any]:
    return await with_remote(args, lambda tc: tier_stats(tc, timeout=args.timeout))


async def evict_command(args: argparse.Namespace) -> int:
    keys = [k.encode() for k in args.key] if args.key else None
    return await with_remote(args, lambda tc: evict(tc, args.tier, keys=keys, namespace=args.namespace,
                                                     key_prefix=args.key_prefix, tenant=args.tenant,
                                                     timeout=args.timeout))


async def drain_command(args: argparse.Namespace) -> DrainReport:
    return await with_remote(args, lambda tc: drain(tc, timeout=args.timeout))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lmcache_valkey.tiering.tierd ...`` (``lmcache-valkey tierd`` without the CLI)."""
    parser = add_tierd_arguments(argparse.ArgumentParser(prog="lmcache-valkey tierd"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run_tierd(args))


def dumps(obj: Any) -> str:
    """JSON for ``tier_stats`` output (bytes keys as text)."""
    return json.dumps(obj, indent=2, sort_keys=True, default=lambda o: o.decode(errors="replace") if isinstance(o, bytes) else str(o))


if __name__ == "__main__":
    raise SystemExit(main())
