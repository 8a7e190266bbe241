"""Builds a FabricTransport from the validated Settings, for ``transport: fabric|auto``.

Provider default per environment: ``efa`` where an EFA device or the AWS EFA install is
present, else ``tcp;ofi_rxm``. Bind address default: the local address the kernel uses to
reach each Valkey node (so the server can reach our endpoint back). Valkey Cluster and TLS
on the control connections are supported (docs/fabric-cluster-tls.md).
"""

from __future__ import annotations

import os
import socket

from lmcache_valkey.codec import HEADER_SIZE
from lmcache_valkey.config import Node, Settings
from lmcache_valkey.errors import FabricUnavailable, ServerError

from ..resp.client import CONTROL_SLACK
from ..resp.connection import make_ssl_context
from .cluster import ClusterFabricTransport
from .transport import FabricTransport


def default_provider() -> str:
    efa_dev = os.path.isdir("/sys/class/infiniband") and any(
        name.startswith(("efa", "rdmap")) for name in os.listdir("/sys/class/infiniband")
    )
    return "efa" if efa_dev else "tcp;ofi_rxm"


def local_addr_towards(host: str, port: int) -> str:
    """The source address the kernel picks to reach host:port (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port or 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


async def open_fabric_transport(settings: Settings) -> FabricTransport | ClusterFabricTransport:
    """Opens the fabric transport for ``settings``: one node, or every primary of a Valkey
    Cluster (``cluster: yes``, several seeds, or ``auto`` and the node answers CLUSTER SLOTS),
    control connections over TLS when configured. Each node gets its own endpoint and one
    HELLO'd connection before this returns; raises FabricUnavailable (or a TransportError)
    when the fabric path cannot be used, so ``auto`` can fall back."""
    if any(n.path for n in settings.nodes):
        raise FabricUnavailable("the fabric transport needs TCP Valkey nodes (the server must reach us back), not a Unix socket")
    provider = settings.fabric.provider or default_provider()
    ssl_context = make_ssl_context(settings.tls) if settings.tls is not None else None

    def make(node: Node) -> FabricTransport:
        return FabricTransport(
            node.host,
            node.port,
            provider=provider,
            bind_addr=settings.fabric.bind_addr or local_addr_towards(node.host, node.port),
            connections=settings.connections_per_node,
            username=settings.username,
            password=settings.password,
            db=settings.db,
            connect_timeout=settings.connect_timeout_s,
            scratch_bytes=settings.fabric.scratch_bytes,
            ssl_context=ssl_context,
            server_name=settings.tls.server_name if settings.tls is not None else None,
            max_reply_bytes=settings.max_chunk_bytes + HEADER_SIZE + CONTROL_SLACK,
            dialect=settings.fabric.dialect,
            bounce_bytes=settings.fabric.bounce_bytes if settings.fabric.dialect == "dma" else 0,
        )

    first = make(settings.nodes[0])
    transport: FabricTransport | ClusterFabricTransport = first
    try:
        if settings.cluster == "yes" or len(settings.nodes) > 1 or (
                settings.cluster == "auto" and await _answers_cluster_slots(first, settings.connect_timeout_s)):
            built = {settings.nodes[0]: first}
            transport = ClusterFabricTransport(settings.nodes, lambda n: built.pop(n, None) or make(n),
                                               connect_timeout=settings.connect_timeout_s)
        await transport.connect()
    except BaseException:
        await transport.close()
        if transport is not first:
            await first.close()
        raise
    return transport


async def _answers_cluster_slots(t: FabricTransport, timeout: float) -> bool:
    """A cluster node answers CLUSTER SLOTS with its slot ranges; a standalone server (or a
    worker's ACL line without +cluster|slots, which only a cluster's line grants) refuses."""
    try:
        return bool(await t.control("CLUSTER", "SLOTS", timeout=timeout))
    except ServerError:
        return False
