"""``lmcache-valkey doctor``: check a deployment from a worker's point of view.

Each check says OK, WARN or FAIL with a diagnosis a person can act on. Checks
that depend on a failed one are skipped. Exit code: 0 all OK (warnings allowed),
1 a check failed, 2 the settings themselves are wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import mmap
import os
import ssl
import sys
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable

from . import acl
from .config import Settings, format_size, tenant_secret_missing
from .endpoint_build import build_command
from .errors import AuthError, LmcacheValkeyError, ServerError, TransportError
from .extras import missing_extra
from .tiering.settings import TieringSettings

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


class Doctor:
    def __init__(self, settings: Settings, *, tiering: TieringSettings | None = None, s3_bucket: str | None = None,
                 s3_endpoint_url: str | None = None, s3_prefix: str = "", fabric_provider: str | None = None) -> None:
        self.settings = settings
        self.tiering = tiering or TieringSettings()
        # The worker's own tiers (embedded) are checked from here; with tiering: service they
        # are tierd's, on the storage node. Flags name a bucket to check either way.
        embedded = self.tiering.mode == "embedded"
        self.s3_bucket = s3_bucket or (self.tiering.s3_bucket if embedded else None)
        self.s3_endpoint_url = s3_endpoint_url or (self.tiering.s3_endpoint_url if embedded else None)
        self.s3_prefix = s3_prefix or (self.tiering.s3_prefix if embedded else "")
        self.fabric_provider = fabric_provider
        self.checks: list[Check] = []
        self._client: Any = None
        self._module_loaded = False  # set by the modules check: the server answers the large-object commands

    def add(self, name: str, status: str, detail: str, fix: str = "") -> None:
        self.checks.append(Check(name, status, detail, fix))

    async def run(self) -> list[Check]:
        connected = await self._connect()
        if connected:
            # modules first: whether the large-object commands exist decides the worker ACL line
            for step in (self._server, self._memory, self._modules, self._fabric_peers, self._slot_migration,
                         self._acl, self._scope, self._secret):
                await self._guard(step)
        else:
            for name in ("server", "memory", "modules", "acl", "scope"):
                self.add(name, SKIP, "not reachable")
            await self._guard(self._secret)
        await self._guard(self._fabric)
        await self._guard(self._checksum)
        await self._guard(self._kv_connector)
        if connected:
            await self._guard(self._transport)
        await self._guard(self._tiering)
        if self.s3_bucket:
            await self._guard(self._s3)
        if self._client is not None:
            await self._client.close()
        return self.checks

    async def _guard(self, step: Callable[[], Awaitable[None]]) -> None:
        name = step.__name__.strip("_")
        try:
            await step()
        except ModuleNotFoundError as e:
            extra = missing_extra(e, f"the {name} check")
            if extra is None:
                self.add(name, FAIL, f"unexpected error: {e!r}")
            else:
                self.add(name, FAIL, f"{e.name} is not installed", f"pip install 'lmcache-valkey[{extra.extra}]'")
        except Exception as e:  # a check must never crash the doctor
            self.add(name, FAIL, f"unexpected error: {e!r}")

    async def _connect(self) -> bool:
        from .transport.resp import RespClient

        s = self.settings
        where = s.url_for_humans
        client = RespClient(s)
        try:
            await client.start()
        except AuthError as e:
            await client.close()
            who = f"user {s.username!r}" if s.username else "the default user"
            self.add("auth", FAIL, f"{where} refused {who}: {e}",
                     "check username/password (or password_file / LMCACHE_VALKEY_PASSWORD) and the server's ACL users")
            return False
        except (TransportError, OSError) as e:
            await client.close()
            cause = e.__cause__ or e
            if await self._tls_mismatch(e):
                return False
            if isinstance(cause, ssl.SSLError) or "SSL" in str(e) or "certificate" in str(e).lower():
                self.add("tls", FAIL, f"TLS handshake with {where} failed: {e}",
                         "check tls_ca_file (the CA that signed the server certificate), tls_server_name, and that the port speaks TLS")
            else:
                self.add("connect", FAIL, f"cannot reach {where}: {e}",
                         "is Valkey running and listening there? check the Service name/port, NetworkPolicy and firewalls")
            return False
        self._client = client
        self.add("connect", OK, f"connected to {where}" + (" over TLS" if s.tls else ""))
        if s.tls:
            self.add("tls", OK, "TLS handshake verified" if s.tls.verify else "TLS without certificate verification (tls_verify: false)")
        return True

    async def _tls_mismatch(self, error: Exception) -> bool:
        """A plain client on a TLS port sees a reset, a TLS client on a plain port a handshake
        that never ends: ask the port which protocol it speaks and say so."""
        s = self.settings
        node = s.nodes[0]
        if node.path:  # unix socket: no TLS there
            return False
        where = s.url_for_humans
        if s.tls is None and await _speaks_tls(node.host, node.port, s.connect_timeout_s):
            self.add("tls", FAIL, f"{where} speaks TLS but the client connected in plain text ({error})",
                     f"use valkeys://{node.host}:{node.port} (or tls: true) with tls_ca_file set to the CA "
                     "that signed the server certificate")
            return True
        if s.tls is not None and await _speaks_plain_resp(node.host, node.port, s.connect_timeout_s):
            self.add("tls", FAIL, f"{where} answers in plain RESP, not TLS ({error})",
                     f"use valkey://{node.host}:{node.port} without tls settings, or the server's TLS port "
                     "(its tls-port)")
            return True
        return False

    async def _info(self, section: str) -> dict[str, str]:
        raw = await self._client.command("INFO", section, timeout=self.settings.op_timeout_s)
        text = raw.decode() if isinstance(raw, (bytes, bytearray)) else str(raw)
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k.strip()] = v.strip()
        return out

    def _refused(self, name: str, e: AuthError) -> None:
        """A check whose command the ACL refuses: what the recommended worker line does."""
        self.add(name, SKIP, f"not visible to this user ({e.message.split(' ', 1)[0]}): "
                             "the recommended worker ACL allows only what the plugin sends")

    async def _server(self) -> None:
        try:
            info = await self._info("server")
        except AuthError as e:
            return self._refused("server", e)
        version = info.get("valkey_version") or info.get("redis_version", "?")
        product = "Valkey" if "valkey_version" in info else "Redis"
        mode = "cluster" if getattr(self._client, "is_cluster", False) else info.get("redis_mode", "standalone")
        self.add("server", OK, f"{product} {version} ({mode})")

    async def _memory(self) -> None:
        try:
            info = await self._info("memory")
        except AuthError as e:
            return self._refused("memory", e)
        maxmem = int(info.get("maxmemory", "0") or 0)
        policy = info.get("maxmemory_policy", "?")
        used = int(info.get("used_memory", "0") or 0)
        if maxmem == 0:
            self.add("memory", WARN, f"no maxmemory set (using {format_size(used)})",
                     "set maxmemory below the pod/host memory limit, or Valkey will be OOM-killed as the cache grows")
        elif policy == "noeviction":
            self.add("memory", WARN, f"maxmemory {format_size(maxmem)} with policy noeviction: puts fail once full",
                     "use allkeys-lru (or volatile-lru with ttl_s) so old chunks make room for new ones")
        else:
            self.add("memory", OK, f"{format_size(used)} of {format_size(maxmem)} used, policy {policy}")

    async def _acl(self) -> None:
        s = self.settings
        probe = f"{s.key_prefix}:{s.tenant}:doctor:probe".encode()
        t = s.op_timeout_s
        try:
            await self._client.command("SET", probe, b"1", "PX", 10000, key=probe, timeout=t)
            await self._client.command("GET", probe, key=probe, timeout=t)
            await self._client.command("UNLINK", probe, key=probe, timeout=t)
        except AuthError as e:
            self.add("acl", FAIL, f"the ACL user cannot read/write its tenant's keys ({e})",
                     f"give it the worker line (ACL file, or ACL SETUSER with the same words): {self._worker_line()}")
            return
        except ServerError as e:
            self.add("acl", FAIL, f"writing a probe key failed: {e}", "see the server's error above (OOM? read-only replica?)")
            return
        self.add("acl", OK, f"read/write allowed on {s.key_prefix}:{s.tenant}:*")

    def _worker_line(self) -> str:
        s = self.settings
        # Under `auto` the plugin takes the fabric path wherever the module answers; naming
        # BLOB.* where no module is loaded would make ACL SETUSER refuse the whole line.
        fabric = s.transport in ("fabric", "blob-tcp") or (s.transport == "auto" and self._module_loaded)
        return acl.worker_line(s.username or "default", s.tenant, prefix=s.key_prefix, cluster=self._is_cluster(),
                               tiering=True, fabric=fabric, db=s.db, fabric_dialect=s.fabric.dialect,
                               durable=s.put_replicas > 0)

    def _is_cluster(self) -> bool:
        return bool(getattr(self._client, "is_cluster", False))

    async def _scope(self) -> None:
        """Can this user run commands that reach past its tenant (wipe, list or swap every
        tenant's keys, load crafted values, see or stop other clients)? Asked with ACL DRYRUN
        when the user may, else queued in a transaction that is discarded, else run with
        harmless arguments where the command has such a form."""
        s = self.settings
        found = await self._probe_privileges()
        allowed = [p for p, v in found if v == acl.ALLOWED]
        unprobed = [p.name for p, v in found if v == acl.UNKNOWN]
        if allowed:
            self.add("scope", WARN, "this user can run " + "; ".join(f"{p.name} ({p.why})" for p in allowed),
                     f"where tenants share this server, allow only what the plugin sends: {self._worker_line()} "
                     "(tierd and operators have their own lines, docs/security.md)")
            return
        note = f"; not probed: {', '.join(unprobed)} (as an operator: ACL DRYRUN {s.username or 'default'} <command>)" \
            if unprobed else ""
        self.add("scope", OK, f"no keyspace-wide or server-wide command allowed ({len(found) - len(unprobed)} probed){note}")

    async def _probe_privileges(self) -> list[tuple[acl.Probe, str]]:
        from .transport.resp.connection import make_ssl_context, open_connection

        s = self.settings
        user = s.username or "default"
        key = f"{s.key_prefix}:{s.tenant}:doctor:probe"
        probes = [(p, tuple(key if a == acl.PROBE_KEY else a for a in p.args)) for p in acl.PROBES]
        node = self._client.primaries()[0] if hasattr(self._client, "primaries") else s.nodes[0]
        conn = await open_connection(node, s, ssl_context=make_ssl_context(s.tls) if s.tls else None)
        t = s.op_timeout_s

        async def ask(*args: Any) -> Any:
            try:
                return await asyncio.wait_for(conn.call(*args), t)
            except ServerError as e:
                return e

        try:
            dry = await ask("ACL", "DRYRUN", user, "PING")
            if acl.classify(dry) == acl.ALLOWED and not isinstance(dry, BaseException):
                # The user may administer ACLs: that alone is past its tenant, and it answers exactly.
                return [(p, acl.ALLOWED if p.name == "ACL" else
                         acl.classify(await ask("ACL", "DRYRUN", user, *args), dryrun=True)) for p, args in probes]
            if acl.classify(await ask("MULTI")) == acl.ALLOWED:
                try:
                    return [(p, acl.classify(await ask(*args))) for p, args in probes]  # queued, never run
                finally:
                    await ask("DISCARD")
            return [(p, acl.classify(await ask(*args)) if p.direct else acl.UNKNOWN) for p, args in probes]
        finally:
            conn.close()

    async def _secret(self) -> None:
        s = self.settings
        if s.tenant_secret is not None:
            self.add("secret", OK, "chunk ids are keyed with the tenant secret")
        elif tenant_secret_missing(s):
            self.add("secret", FAIL, f"no tenant_secret for tenant {s.tenant!r}: its workers refuse to start "
                                     "(a tenant other than 'default' needs one)",
                     "set tenant_secret_file (the same secret in every worker of the tenant; `openssl rand -hex 32`), "
                     "or accept the risk with require_tenant_secret: false (docs/security.md)")
        elif s.username or s.tenant != "default":
            opted = " (require_tenant_secret: false)" if s.tenant != "default" else ""
            self.add("secret", WARN, f"no tenant_secret{opted}: whoever knows the tenant name {s.tenant!r} can "
                                     "compute its chunk ids, and whoever learns a key name can confirm a guessed "
                                     "prompt was cached",
                     "set tenant_secret_file (the same secret in every worker of the tenant; `openssl rand -hex 32`)")

    async def _modules(self) -> None:
        HELLO = self._dialect().hello_command

        t = self.settings.op_timeout_s
        wants = self.settings.transport in ("fabric", "auto")
        try:
            names = sorted(_module_names(await self._client.command("MODULE", "LIST", timeout=t)))
        except ServerError as e:  # ACL, or a managed service without MODULE: the probe below decides
            names = [f"(MODULE LIST refused: {e.message.split(' ', 1)[0]})"]
        try:
            info = await self._client.command("COMMAND", "INFO", HELLO, timeout=t)
            loaded = bool(info) and info[0] is not None
        except ServerError:  # refused by the ACL or by a managed service
            # The worker line refuses COMMAND; ask the command itself: the server answers an
            # unknown command before it consults the ACL (and checks arity before it too).
            try:
                await self._client.command(HELLO, timeout=t)
                loaded = True
            except ServerError as e:
                loaded = "unknown command" not in e.message.lower()
        self._module_loaded = loaded
        if loaded:
            self.add("modules", OK, f"fabric endpoint answers {HELLO}{await self._which_module(names)} "
                                    f"(modules: {', '.join(names)})")
        elif wants:
            status = FAIL if self.settings.transport == "fabric" else WARN
            self.add("modules", status, f"no fabric endpoint module loaded (modules: {', '.join(names) or 'none'})",
                     f"build the module with `{build_command()}` and load DIR/lmcv_blob.so (loadmodule in "
                     "valkey.conf, or the chart's valkey.module.enabled), or set transport: tcp")
        else:
            self.add("modules", OK, f"transport tcp; modules: {', '.join(names) or 'none'}")

    def _dialect(self) -> Any:
        """The configured fabric dialect's names (pure Python: no libfabric needed)."""
        from .transport.fabric import commands, dma

        return dma.DMA if self.settings.fabric.dialect == dma.NAME else commands.LARGE_OBJECT

    async def _which_module(self, names: list[str]) -> str:
        """Which module serves the dialect, in words: by MODULE LIST, or where that is refused
        (managed services), by its INFO section (valkey-large-object's ``INFO largeobj``)."""
        for name, what in _KNOWN_MODULES.items():
            if name in names:
                return f": {what}"
        for section, what in (("lmcvblob", _KNOWN_MODULES["lmcvblob"]), ("largeobj", _KNOWN_MODULES["largeobj"])):
            try:
                info = await self._info(section)
            except (AuthError, ServerError):
                return ""
            if info:
                return f": {what} (INFO {section})"
        return ""

    async def _fabric_peers(self) -> None:
        """Which mode the fabric endpoint runs in (our module's argument ``require_proof``):
        from ``INFO lmcvblob`` where this user may ask, else from how the server answers a
        HELLO without PROOF (the worker line allows HELLO, not INFO). The weak mode is a
        warning: it is meant only for clients that cannot prove (docs/security.md)."""
        if not self._module_loaded:
            return
        from .transport.fabric import commands

        hello = self._dialect().hello_command
        family = hello.split(".", 1)[0]
        t = self.settings.op_timeout_s
        try:
            info = await self._info(commands.INFO_SECTION)
        except (AuthError, ServerError):
            info = {}
        mode = info.get(f"{commands.INFO_SECTION}_peer_mode")
        fix = ("drop `require_proof no` from the module's load line unless clients that cannot prove use this server "
               "(other large-object clients); then confine the fabric network and keep tenants off "
               "MONITOR/SLOWLOG/CLIENT (docs/security.md, Server module and fabric peers)")
        if mode == commands.PEER_MODE_PROVEN:
            self.add("fabric_peers", OK, "the fabric endpoint requires every session to prove the fabric address it "
                                         "claims and moves bytes only inside the regions it declared (require_proof "
                                         "yes, the default)")
        elif mode == commands.PEER_MODE_UNPROVEN:
            warning = info.get(f"{commands.INFO_SECTION}_peer_warning", "no address proof")
            self.add("fabric_peers", WARN, f"the fabric endpoint runs with require_proof no: {warning}", fix)
        else:
            # A server that asks for no proof goes on to look at the (malformed) address; one
            # that requires it refuses first, without touching its address table.
            try:
                await self._client.command(hello, "00", timeout=t)
                refusal = ""
            except AuthError as e:
                return self._refused("fabric_peers", e)
            except ServerError as e:
                refusal = e.message
            if refusal.startswith("NOPROOF"):
                self.add("fabric_peers", OK, f"the fabric endpoint refuses {hello} without an address proof "
                                             "(require_proof yes, the default)")
            else:
                self.add("fabric_peers", WARN, f"the fabric endpoint takes {hello} without an address proof "
                         f"(an upstream {family}.* module, or ours with require_proof no): any client allowed "
                         f"{family}.* can claim another worker's fabric address, and only the secrecy of its remote "
                         "keys keeps others out of its registered memory", fix)

    async def _slot_migration(self) -> None:
        """Which resharding the cluster offers with our module loaded (``INFO lmcvblob``'s
        ``atomic_slot_migration``): Valkey 9 refuses ``CLUSTER MIGRATESLOTS`` on every node
        while a loaded module has not declared support, and servers before 9.0 have neither
        the command nor the declaration."""
        if not self._module_loaded or not self._is_cluster():
            return
        from .transport.fabric import commands

        try:
            info = await self._info(commands.INFO_SECTION)
        except AuthError as e:
            return self._refused("slot_migration", e)
        except ServerError:
            info = {}
        declared = info.get(f"{commands.INFO_SECTION}_atomic_slot_migration")
        if declared is None:
            return  # another large-object module, or an older build of ours: nothing to read it from
        if declared == "1":
            self.add("slot_migration", OK, "the module's keys move with their slots by CLUSTER MIGRATESLOTS "
                                           "(atomic slot migration) and by legacy MIGRATE")
        else:
            self.add("slot_migration", WARN, "this server cannot move the module's keys by atomic slot migration "
                     "(CLUSTER MIGRATESLOTS needs Valkey 9.0+): resharding is the legacy kind only, key by key, "
                     "with ASK redirects while a slot is half-moved",
                     "reshard with `valkey-cli --cluster reshard` (SETSLOT/MIGRATE), or upgrade the nodes to "
                     "Valkey 9.0+ (docs/cluster.md)")

    async def _fabric(self) -> None:
        if self.settings.transport in ("tcp", "blob-tcp"):
            self.add("fabric", SKIP, f"transport is {self.settings.transport}")
            return
        from .errors import FabricUnavailable
        from .transport.fabric import FabricEndpoint, libfabric_version

        status = FAIL if self.settings.transport == "fabric" else WARN
        provider = self.fabric_provider or self.settings.fabric.provider or "tcp;ofi_rxm"
        try:
            version = libfabric_version()
            with FabricEndpoint(provider, node=self.settings.fabric.bind_addr or "127.0.0.1") as ep:
                opened = ep.provider
        except FabricUnavailable as e:
            self.add("fabric", status, str(e),
                     "install libfabric (Debian: apt-get install libfabric-dev libfabric-bin; AWS: the EFA installer), "
                     "pick an offered provider in fabric_provider (see `fi_info -l`), or set transport: tcp")
            return
        self.add("fabric", OK, f"libfabric {version}: provider {opened} opens")

    async def _checksum(self) -> None:
        from . import checksum

        if checksum.IMPLEMENTATION == "isal":
            self.add("checksum", OK, "CRC32C of payloads by ISA-L (libisal.so.2)")
        elif checksum.ISAL_MISSING is None:
            self.add("checksum", OK, "CRC32C of payloads by the crc32c package (LMCACHE_VALKEY_CRC32C=crc32c)")
        else:
            self.add("checksum", WARN,
                     f"CRC32C of payloads by the crc32c package: {checksum.ISAL_MISSING}; "
                     "each put and get then spends about twice the CPU on its checksum",
                     "install ISA-L (Debian/Ubuntu: apt-get install libisal2)")

    async def _kv_connector(self) -> None:
        """Whether LMCache inside vLLM here will have a KV connector, or recompute everything."""
        from .integrations.vllm_cpu import diagnose

        self.add("kv_connector", *diagnose())

    async def _transport(self) -> None:
        """The transport the plugin will pick here, in which dialect, over which provider,
        and why -- asked with documented commands only (no MODULE LIST, no CONFIG) -- and, for
        a large-object server without our extensions, what that leaves open."""
        from dataclasses import replace

        s = self.settings
        if s.transport == "tcp":
            self.add("transport", OK, "tcp: chunks as Valkey strings over RESP (transport: tcp)")
            return
        why_not_fabric = ""
        if s.transport in ("fabric", "auto"):
            from .transport.fabric import open_fabric_transport

            fabric = replace(s.fabric, provider=self.fabric_provider or s.fabric.provider)
            try:
                t = await asyncio.wait_for(open_fabric_transport(replace(s, fabric=fabric)), s.connect_timeout_s + 10)
            except Exception as e:  # noqa: BLE001 -- any refusal is the reason auto falls back
                why_not_fabric = f"{type(e).__name__}: {e}"
            else:
                try:
                    self._report_fabric(t)
                finally:
                    await t.close()
                return
            if s.transport == "fabric":
                self.add("transport", FAIL, f"fabric cannot be used: {why_not_fabric}",
                         "see the modules and fabric checks above, or set transport: blob-tcp or tcp")
                return
        key = f"{s.key_prefix}:{s.tenant}:probe:large-object".encode()
        try:
            has_blob = await self._client.command("BLOB.INFO", key, key=key, timeout=s.op_timeout_s) is None
        except ServerError:
            has_blob = False
        if s.transport == "blob-tcp":
            if has_blob:
                self.add("transport", OK, "blob-tcp: chunks as large objects (BLOB.TCP_SET/BLOB.TCP_GET), chosen by "
                                          "transport: blob-tcp; the server answers BLOB.INFO")
            else:
                self.add("transport", FAIL, "blob-tcp: the server does not answer BLOB.INFO (no large-object module)",
                         "load valkey-large-object or our module (endpoint/), or set transport: tcp")
            return
        hint = "; the server has the large-object commands: transport: blob-tcp would keep chunks there" if has_blob else ""
        self.add("transport", OK, f"auto chose tcp (RESP strings): fabric not possible ({why_not_fabric}){hint}")

    def _report_fabric(self, t: Any) -> None:
        nodes = getattr(t, "nodes", None)
        one = next(iter(nodes.values())) if nodes else t
        provider = one.endpoint.provider if one.endpoint is not None else "?"
        where = f"{len(nodes)} cluster primaries" if nodes else "one node"
        tls = ", TLS control connections" if self.settings.tls is not None else ""
        d = self._dialect()
        family = d.hello_command.split(".", 1)[0]
        words = ("valkey-large-object dialect (BLOB.RDMA_*)" if family == "BLOB" else
                 "Momento's DMA dialect (DMA.SET/DMA.GET, values as strings)")
        detail = (f"fabric: {words}, provider {provider}, {where}{tls}; chosen "
                  f"because the server answered {d.hello_command} and the provider opened")
        if t.peer_proof:
            self.add("transport", OK, detail + "; extensions on: each session proved its fabric address, "
                                               "transfers confined to declared regions")
        else:
            self.add("transport", WARN, detail + "; the server has none of our extensions (upstream module or "
                     f"extensions no): any client allowed {family}.* can claim this worker's fabric address, so only "
                     "the secrecy of its remote keys keeps others out of its registered memory",
                     "with our module set require_proof yes; otherwise keep tenants off MONITOR/SLOWLOG/CLIENT and "
                     "confine the fabric network (docs/security.md, Server module and fabric peers)")

    async def _tiering(self) -> None:
        """The tiering keys of --config, checked as the worker will use them: with
        ``embedded`` its NVMe directory (the bucket is the s3 check), with ``service`` that a
        tierd answers for this tenant."""
        ts = self.tiering
        if ts.mode == "off":
            self.add("tiering", SKIP, "off (Valkey RAM only)")
            return
        if ts.mode == "service":
            await self._tierd_answers()
            return
        tiers = [f"NVMe {ts.nvme_dir} ({format_size(ts.nvme_budget_bytes)})" if ts.nvme_dir else "",
                 f"S3 bucket {ts.s3_bucket!r}" if ts.s3_bucket else ""]
        self.add("tiering", OK, "embedded in the worker: " + ", ".join(t for t in tiers if t))
        if ts.nvme_dir:
            self._nvme_dir(ts)

    async def _tierd_answers(self) -> None:
        from .tiering.client import RemoteTierClient

        s = self.settings
        if self._client is None:
            self.add("tiering", SKIP, "service: Valkey not reachable, tierd not asked")
            return
        client = RemoteTierClient(self._client, s)
        try:
            stats = await client.control("stats", timeout=TIERD_WAIT_S)
        except (TimeoutError, asyncio.TimeoutError, RuntimeError, TransportError) as e:
            self.add("tiering", FAIL, f"tiering: service, but no tierd answered for tenant {s.tenant!r} within "
                                      f"{TIERD_WAIT_S:g}s ({type(e).__name__})",
                     f"run `lmcache-valkey tierd --valkey-url <this Valkey> --tenant {s.tenant}` next to Valkey "
                     "(the chart's tierd sidecar, tierd.tenant), or set tiering: off")
            return
        finally:
            await client.close()
        tiers = [name for name in ("nvme", "s3") if isinstance(stats.get(name), dict)]
        self.add("tiering", OK, f"service: tierd answers for tenant {s.tenant!r} "
                                f"(tiers: {', '.join(tiers) or 'none'}; {int(stats.get('chunks_indexed', 0)):,} "
                                "chunk(s) indexed)")

    def _nvme_dir(self, ts: TieringSettings) -> None:
        """The embedded NVMe tier's directory: there or creatable, writable, big enough, O_DIRECT."""
        path = ts.nvme_dir or ""
        existing = path
        while existing and not os.path.exists(existing):
            existing = os.path.dirname(existing.rstrip("/")) or "/"
        if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
            self.add("nvme", FAIL, f"nvme_dir {path} cannot be {'written' if existing == path else 'created'} "
                                   f"by this user ({existing} is not a writable directory)",
                     "point nvme_dir at a directory on the NVMe filesystem that the worker's user can write")
            return
        st = os.statvfs(existing)
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        notes = [] if existing == path else [f"will be created under {existing}"]
        status = OK
        fix = ""
        if ts.nvme_budget_bytes > total:
            status = FAIL
            notes.append(f"budget {format_size(ts.nvme_budget_bytes)} exceeds the filesystem ({format_size(total)})")
            fix = "lower nvme_budget_bytes below the filesystem's size (leave headroom)"
        elif ts.nvme_budget_bytes > free:
            status = WARN
            notes.append(f"budget {format_size(ts.nvme_budget_bytes)} exceeds the free space ({format_size(free)}): "
                         "writes past it are refused (counted)")
            fix = "free space on that filesystem or lower nvme_budget_bytes"
        if ts.nvme_direct and not _accepts_o_direct(existing):
            status = WARN if status == OK else status
            notes.append("the filesystem refuses O_DIRECT: buffered I/O through the page cache")
            fix = fix or "put nvme_dir on an ext4/xfs NVMe filesystem (not tmpfs/overlay), or set nvme_direct: false"
        detail = f"{path}: {format_size(free)} free of {format_size(total)}, budget {format_size(ts.nvme_budget_bytes)}"
        self.add("nvme", status, "; ".join([detail, *notes]), fix)

    async def _s3(self) -> None:
        from dataclasses import replace

        from .tiering.object_store import ObjectTier

        ts = replace(self.tiering, mode="service", s3_bucket=self.s3_bucket, s3_endpoint_url=self.s3_endpoint_url,
                     s3_prefix=self.s3_prefix or "lmcache-valkey", s3_timeout_s=5.0)
        tier = ObjectTier(ts)
        try:
            await tier.start()
            n = 0
            async for _ in tier.inventory(self.settings.tenant):
                n += 1
                if n >= 1000:
                    break
        except LmcacheValkeyError as e:
            self.add("s3", FAIL, f"bucket {self.s3_bucket!r}: {e}",
                     "check s3_endpoint_url, credentials (AWS_* env, IRSA role annotation) and that the bucket exists")
            return
        finally:
            await tier.close()
        shown = f"{n}+" if n >= 1000 else str(n)
        self.add("s3", OK, f"bucket {self.s3_bucket!r} reachable; {shown} chunk object(s) for tenant {self.settings.tenant!r}")


def render(checks: list[Check], as_json: bool) -> str:
    if as_json:
        return json.dumps([asdict(c) for c in checks], indent=2)
    marks = {OK: "OK  ", WARN: "WARN", FAIL: "FAIL", SKIP: "skip"}
    lines = []
    for c in checks:
        lines.append(f"[{marks[c.status]}] {c.name:<8} {c.detail}")
        if c.fix and c.status in (WARN, FAIL):
            lines.append(f"           -> {c.fix}")
    return "\n".join(lines)


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def run_doctor(settings: Settings, *, as_json: bool = False, out: Any = None, **kw: Any) -> int:
    """Run every check and print them; ``kw`` go to :class:`Doctor` (``tiering``, ``s3_*``)."""
    checks = asyncio.run(Doctor(settings, **kw).run())
    print(render(checks, as_json), file=out or sys.stdout)
    return exit_code(checks)


TIERD_WAIT_S = 3.0  # a tierd that serves requests answers stats within milliseconds
PROBE_BYTES = 64


async def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    """True when a TLS handshake (certificate not checked: this only asks the protocol) succeeds."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), timeout)
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        return False
    writer.close()
    return True


async def _speaks_plain_resp(host: str, port: int, timeout: float) -> bool:
    """True when the port answers a plain PING with a RESP reply (+PONG, or -NOAUTH and kin)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        writer.write(b"PING\r\n")
        reply = await asyncio.wait_for(reader.read(PROBE_BYTES), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        writer.close()
    return reply[:1] in (b"+", b"-") and reply.endswith(b"\r\n")


def _accepts_o_direct(directory: str) -> bool:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    path = os.path.join(directory, f".lmcv-doctor-probe.{os.getpid()}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | flag, 0o600)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
        try:
            os.write(fd, buf)
        finally:
            buf.close()
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


# Modules that serve a fabric dialect, by the name MODULE LIST gives them.
_KNOWN_MODULES = {
    "lmcvblob": "lmcache-valkey's reference module (BLOB.* and DMA.*)",
    "largeobj": "valkey-large-object (BLOB.*; docs/large-object-conformance.md)",
    "valkey-dma": "Momento's DMA module (DMA.*; docs/fabric-dma-dialect.md)",
}


def _module_names(reply: Any) -> list[str]:
    names = []
    for entry in reply or []:
        # each entry is a flat [b"name", b"lmcvblob", b"ver", 1, ...] list
        for k, v in zip(entry[::2], entry[1::2]):
            if k in (b"name", "name"):
                names.append(v.decode() if isinstance(v, bytes) else str(v))
    return names


__all__ = ["Doctor", "Check", "run_doctor", "render", "exit_code"]
