"""Builds a FabricTransport from the validated Settings, for ``transport: fabric|auto``.

Provider default per environment: ``efa`` where an EFA device or the AWS EFA install is
present, else ``tcp;ofi_rxm``. Bind address default: the local address the kernel uses to
reach the Valkey node (so the server can reach our endpoint back).
"""

from __future__ import annotations

import os
import socket

from lmcache_valkey.config import Settings
from lmcache_valkey.errors import FabricUnavailable

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


async def open_fabric_transport(settings: Settings) -> FabricTransport:
    """Opens the endpoint and one HELLO'd connection; raises FabricUnavailable (or a
    TransportError) when the fabric path cannot be used, so ``auto`` can fall back."""
    if len(settings.nodes) != 1 or settings.nodes[0].path:
        raise FabricUnavailable("the fabric transport needs exactly one TCP Valkey node (no Unix socket, no cluster)")
    if settings.tls is not None:
        raise FabricUnavailable("the fabric transport's control connection has no TLS; use transport: tcp")
    if settings.cluster == "yes":
        raise FabricUnavailable("the fabric transport does not route Valkey Cluster slots; use transport: tcp")
    node = settings.nodes[0]
    provider = settings.fabric.provider or default_provider()
    bind = settings.fabric.bind_addr or local_addr_towards(node.host, node.port)
    transport = FabricTransport(
        node.host,
        node.port,
        provider=provider,
        bind_addr=bind,
        connections=settings.connections_per_node,
        username=settings.username,
        password=settings.password,
        db=settings.db,
        connect_timeout=settings.connect_timeout_s,
        scratch_bytes=settings.fabric.scratch_bytes,
    )
    try:
        await transport.connect()
    except BaseException:
        await transport.close()
        raise
    return transport
