"""A fabric session opened by hand, as our client opens it, for tests that speak the BLOB.*
commands on a plain connection: on a server with the default ``require_proof yes`` a
session must prove the address it claims and declare the regions it lends."""

from __future__ import annotations

from typing import Any

from lmcache_valkey.transport.fabric import FabricEndpoint, MemoryRegion, commands


def proven_hello(c: Any, ep: FabricEndpoint, region: MemoryRegion, buf: bytearray) -> None:
    """HELLO ep's address PROOF REGION <buf> on the valkey-py connection ``c``, the nonce put
    in buf's first bytes (which it overwrites), then PROVE. ``buf`` is ``region``'s buffer."""
    base = region.remote_addr(region.addr)
    reply = c.execute_command(*commands.hello(ep.name, True, [(region.key, base, len(buf))]))
    _, nonce = commands.parse_hello_reply(reply, proof=True)
    buf[: len(nonce)] = nonce
    c.execute_command(commands.PROVE, region.key, base)
