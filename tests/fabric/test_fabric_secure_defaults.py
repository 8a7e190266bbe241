"""The module as installed, with no security argument on its load line, keeps one client out
of another's fabric memory (issue 28, item 1).

Every server here is loaded exactly as ``--loadmodule lmcv_blob.so provider 'tcp;ofi_rxm'
bind 127.0.0.1 arena_mb 64``. An attacker allowed the BLOB.* commands who has learnt a
victim's fabric address, remote key and buffer address (all three leaked) tries to claim
the victim's address and have the server write into, or read out of, the victim's memory,
in both dialects. The weaker mode (``require_proof no``) is an explicit setting, tested
where it is needed (test_fabric_peer_isolation.py, test_fabric_errors.py).
"""

from __future__ import annotations

import asyncio
import os
from contextlib import AsyncExitStack

import pytest
import valkey

from lmcache_valkey.transport.fabric import FabricEndpoint, FabricTransport, commands

SIZE = 4096
VICTIM_BYTES = bytes(range(256)) * (SIZE // 256)
ATTACKER_BYTES = os.urandom(SIZE)

# (HELLO, GET, SET) in each dialect the module answers.
DIALECTS = {
    "upstream": (commands.HELLO, commands.RDMA_GET, commands.RDMA_SET),
    "deprecated": (commands.LEGACY[0], commands.LEGACY[2], commands.LEGACY[1]),  # LEGACY is (HELLO, SET, GET)
}


def _default_server(start_server):
    return start_server("tcp;ofi_rxm", arena_mb=64)  # no require_proof, no other option


def _attacker(srv) -> valkey.Valkey:
    return valkey.Valkey(port=srv.port, single_connection_client=True, socket_timeout=10)


async def _victim(srv, stack):
    """A worker of ours with a registered buffer holding its bytes, its session established."""
    victim = await stack.enter_async_context(FabricTransport("127.0.0.1", srv.port, bulk_fallback=False))
    buf = bytearray(VICTIM_BYTES)
    region = victim.register_buffer(buf)
    mv = memoryview(buf)
    srv.client().execute_command(commands.TCP_SET, b"warm-up", b"w" * SIZE)
    assert await victim.get_into(b"warm-up", [mv], 10) == SIZE  # its own session works (and proved)
    assert victim.peer_proof is True
    mv[:] = VICTIM_BYTES
    return victim, buf, region


async def _run(a: valkey.Valkey, *args) -> object:
    """One command; a refusal comes back as the exception (the attack goes on regardless)."""
    try:
        return await asyncio.to_thread(a.execute_command, *args)
    except valkey.ResponseError as e:
        return e


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
async def test_a_claimed_fabric_address_reaches_nothing_on_the_default_load_line(start_server, dialect):
    hello, get, set_ = DIALECTS[dialect]
    srv = _default_server(start_server)
    admin = srv.client()
    admin.execute_command(commands.TCP_SET, b"attacker-data", ATTACKER_BYTES)
    async with AsyncExitStack() as stack:
        victim, buf, region = await _victim(srv, stack)
        rkey, addr = region.key, region.remote_addr(region.addr)
        a = _attacker(srv)
        try:
            said_hello = await _run(a, hello, victim.endpoint.name.hex())
            got = await _run(a, get, b"attacker-data", rkey, addr, SIZE)
            stole = await _run(a, set_, b"stolen", SIZE, rkey, addr, SIZE)
        finally:
            a.close()
        assert bytes(buf) == VICTIM_BYTES, "the attacker's bytes landed in the victim's memory"
        assert admin.execute_command(commands.TCP_GET, b"stolen") is None, "the victim's bytes were read out"
        # Refused at HELLO: no proof offered, and the server requires one by default.
        assert isinstance(said_hello, valkey.ResponseError) and "NOPROOF" in str(said_hello), said_hello
        assert isinstance(got, valkey.ResponseError) and isinstance(stole, valkey.ResponseError), (got, stole)
        # The victim is none the worse for it.
        assert await victim.get_into(b"attacker-data", [memoryview(buf)], 10) == SIZE
        assert bytes(buf) == ATTACKER_BYTES

    info = srv.info()
    assert info["require_proof"] == 1 and info["peer_mode"] == commands.PEER_MODE_PROVEN, info
    assert "peer_warning" not in info


async def test_offering_a_proof_for_a_claimed_address_and_regions_still_reaches_nothing(start_server):
    """The attacker declares the victim's buffer as its region and asks for a nonce: it
    cannot put the nonce in the victim's memory, so the session never becomes usable."""
    srv = _default_server(start_server)
    admin = srv.client()
    admin.execute_command(commands.TCP_SET, b"attacker-data", ATTACKER_BYTES)
    async with AsyncExitStack() as stack:
        victim, buf, region = await _victim(srv, stack)
        rkey, addr = region.key, region.remote_addr(region.addr)
        a = _attacker(srv)
        try:
            reply = a.execute_command(*commands.hello(victim.endpoint.name, True, [(rkey, addr, SIZE)]))
            commands.parse_hello_reply(reply, proof=True)
            proved = await _run(a, commands.PROVE, rkey, addr)
            got = await _run(a, commands.RDMA_GET, b"attacker-data", rkey, addr, SIZE)
            stole = await _run(a, commands.RDMA_SET, b"stolen", SIZE, rkey, addr, SIZE)
        finally:
            a.close()
        assert all(isinstance(r, valkey.ResponseError) and "NOPROOF" in str(r) for r in (proved, got, stole)), \
            (proved, got, stole)
        assert bytes(buf) == VICTIM_BYTES
        assert admin.execute_command(commands.TCP_GET, b"stolen") is None


def test_a_session_that_declared_no_region_moves_nothing(start_server):
    """On defaults a session is confined to the regions it declared, and one that declared
    none is confined to nothing: not even its proof is read from an undeclared address."""
    srv = _default_server(start_server)
    srv.client().execute_command(commands.TCP_SET, b"k", b"x" * SIZE)
    with FabricEndpoint("tcp;ofi_rxm", node="127.0.0.1") as ep:
        buf = bytearray(SIZE)
        region = ep.register_buffer(buf)
        triple = (region.key, region.remote_addr(region.addr), SIZE)
        c = _attacker(srv)
        try:
            reply = c.execute_command(*commands.hello(ep.name, True))  # PROOF, no REGION
            _, nonce = commands.parse_hello_reply(reply, proof=True)
            buf[: len(nonce)] = nonce  # the proof is in place, at an address it did not declare
            with pytest.raises(valkey.ResponseError, match="BADREGION"):
                c.execute_command(commands.PROVE, triple[0], triple[1])
            with pytest.raises(valkey.ResponseError, match="NOPROOF"):
                c.execute_command(commands.RDMA_GET, b"k", *triple)
        finally:
            c.close()
        assert bytes(buf[len(nonce):]) == bytes(SIZE - len(nonce))
    assert srv.info()["outside_regions"] == 1


def test_the_weak_mode_is_explicit_and_says_what_it_leaves_open(start_server):
    srv = start_server("tcp;ofi_rxm", arena_mb=64, extra=("require_proof", "no"))
    info = srv.info()
    assert info["require_proof"] == 0 and info["peer_mode"] == commands.PEER_MODE_UNPROVEN, info
    assert "fabric address" in info["peer_warning"], info
    assert "require_proof no" in srv.log.read_text(errors="replace")


def test_the_upstream_dialect_alone_needs_the_weak_mode_said_out_loud(start_server):
    """``extensions no`` (HELLO without PROOF) on the default require_proof refuses to load
    and says what to add, rather than quietly weakening the default."""
    with pytest.raises(RuntimeError, match="require_proof no"):
        start_server("tcp;ofi_rxm", arena_mb=64, extra=("extensions", "no"))
    srv = start_server("tcp;ofi_rxm", arena_mb=64, extra=("extensions", "no", "require_proof", "no"))
    assert srv.info()["peer_mode"] == commands.PEER_MODE_UNPROVEN
