"""A client allowed the module's commands cannot reach another worker's registered memory:
remote keys are random, a session proves it owns the fabric address it claims before the
server moves a byte for it, transfers stay inside the regions the session declared, and a
client facing a server without these extensions still works (and says so)."""

from __future__ import annotations

import asyncio
import os

import pytest
import valkey

from lmcache_valkey.transport.fabric import FabricEndpoint, FabricTransport, commands

MiB = 1 << 20
GUARD = 0xA5


def _victim_memory(t: FabricTransport, size: int = 4 * MiB):
    arena = bytearray([GUARD]) * size
    region = t.register_buffer(arena)
    return memoryview(arena), region


def _untouched(mv: memoryview) -> bool:
    return mv.tobytes().count(GUARD) == len(mv)


def _attacker(srv) -> valkey.Valkey:
    return valkey.Valkey(port=srv.port, single_connection_client=True, socket_timeout=10)


def test_remote_keys_are_not_guessable():
    with FabricEndpoint("tcp;ofi_rxm") as ep:
        if ep.mr_mode & ep._lib.FI_MR_PROV_KEY:
            pytest.skip("this provider picks its own keys")
        keys = [ep.register_buffer(bytearray(4096)).key for _ in range(8)]
    assert len(set(keys)) == 8
    assert min(keys) > 1 << 20 and max(keys) > 1 << 48, keys  # not a counter from 1
    assert all(abs(a - b) > 1 << 16 for a, b in zip(keys, keys[1:])), keys


async def test_guessed_keys_at_a_victims_address_write_nothing(start_server):
    """In the weak mode (``require_proof no``) the upstream dialect (plain HELLO, any claimed
    address, no regions) is all an attacker needs: what keeps the victim's memory out of
    reach there is that its keys cannot be guessed. (On defaults HELLO is refused at once:
    test_fabric_secure_defaults.py.)"""
    srv = start_server("tcp;ofi_rxm", extra=("require_proof", "no"))
    srv.client().execute_command(commands.TCP_SET, b"attacker-data", os.urandom(64 * 1024))

    async with FabricTransport("127.0.0.1", srv.port) as victim:
        mv, region = _victim_memory(victim)
        a = _attacker(srv)
        a.execute_command(commands.HELLO, victim.endpoint.name.hex())  # the victim's address
        for guess in range(1, 33):
            for addr in (0, region.remote_addr(region.addr)):
                try:
                    await asyncio.to_thread(a.execute_command, commands.RDMA_GET, b"attacker-data", guess, addr,
                                            64 * 1024, commands.OPT_TIMEOUT, 1000)
                except valkey.ResponseError:
                    pass
        assert _untouched(mv)
        a.close()



async def test_a_session_must_prove_the_address_it_claims(start_server):
    srv = start_server("tcp;ofi_rxm", extra=("require_proof", "yes"))
    srv.client().execute_command(commands.TCP_SET, b"k", os.urandom(MiB))

    async with FabricTransport("127.0.0.1", srv.port, bulk_fallback=False) as victim:
        mv, region = _victim_memory(victim)
        assert await victim.get_into(b"k", [mv[:MiB]], 10) == MiB  # the owner proves and works
        assert victim.peer_proof is True
        mv[:MiB] = bytes([GUARD]) * MiB
        # Even with the victim's key and address (leaked), a claimed address is useless:
        key, addr = region.key, region.remote_addr(region.addr)
        a = _attacker(srv)
        with pytest.raises(valkey.ResponseError, match="NOPROOF"):
            a.execute_command(commands.HELLO, victim.endpoint.name.hex())  # no proof offered
        # (it declares the victim's buffer as its region: a session without one proves nothing)
        reply = a.execute_command(*commands.hello(victim.endpoint.name, True, [(key, addr, MiB)]))
        _, nonce = commands.parse_hello_reply(reply, proof=True)
        with pytest.raises(valkey.ResponseError, match="NOPROOF"):
            await asyncio.to_thread(a.execute_command, commands.PROVE, key, addr)  # nonce is not there
        with pytest.raises(valkey.ResponseError, match="NOPROOF"):
            a.execute_command(commands.RDMA_GET, b"k", key, addr, MiB)
        with pytest.raises(valkey.ResponseError, match="no proof is pending"):
            a.execute_command(commands.PROVE, key, addr)  # one attempt per session
        a.close()
        assert _untouched(mv)

    info = srv.info()
    assert info["proofs_failed"] == 1 and info["proofs_ok"] >= 1


async def test_a_proven_session_only_reaches_its_own_endpoint_and_regions(start_server):
    """An attacker that proves its own address can name the victim's key in its triples:
    the server writes only to the attacker's own endpoint (where that key means nothing),
    and only inside the regions the attacker declared."""
    srv = start_server("tcp;ofi_rxm", extra=("require_proof", "yes"))
    srv.client().execute_command(commands.TCP_SET, b"k", os.urandom(MiB))

    async with FabricTransport("127.0.0.1", srv.port) as victim, \
            FabricTransport("127.0.0.1", srv.port, bulk_fallback=False) as attacker:
        mv, region = _victim_memory(victim)
        _own, own_region = _victim_memory(attacker, MiB)
        await attacker.connect()
        assert attacker.peer_proof is True
        for triple in ((region.key, region.remote_addr(region.addr), MiB),
                       (own_region.key, own_region.remote_addr(own_region.addr) + MiB, MiB)):
            with pytest.raises(Exception):
                await attacker.command(commands.RDMA_GET, b"k", *triple, timeout=5)
        assert _untouched(mv)

    assert srv.info()["outside_regions"] == 2


def test_remote_keys_and_addresses_stay_out_of_slowlog_and_monitor(start_server):
    srv = start_server("tcp;ofi_rxm")
    admin = srv.client()
    admin.config_set("slowlog-log-slower-than", 0)
    admin.execute_command(commands.TCP_SET, b"k", os.urandom(MiB))

    async def body() -> None:
        async with FabricTransport("127.0.0.1", srv.port) as t:
            mv, region = _victim_memory(t)
            assert await t.get_into(b"k", [mv[:MiB]], 10) == MiB
            return region

    region = asyncio.run(body())
    logged = [entry["command"] for entry in admin.slowlog_get(128)]
    text = b" ".join(logged)
    assert str(region.key).encode() not in text, logged
    assert any(commands.RDMA_GET.encode() in line and b"redacted" in line for line in logged), logged
    assert any(commands.HELLO.encode() in line for line in logged), logged


async def test_against_a_server_without_the_extensions_the_client_works_and_says_so(start_server):
    # The upstream dialect alone: its clients cannot prove, so the weak mode is said out loud.
    srv = start_server("tcp;ofi_rxm", extra=("extensions", "no", "require_proof", "no"))
    value = os.urandom(2 * MiB)

    async with FabricTransport("127.0.0.1", srv.port, bulk_fallback=False) as t:
        arena = bytearray(4 * MiB)
        t.register_buffer(arena)
        mv = memoryview(arena)
        mv[: len(value)] = value
        await t.set_from(b"k", [mv[: len(value)]], None, 10)
        assert await t.get_into(b"k", [mv[2 * MiB :]], 10) == len(value) and mv[2 * MiB :] == value
        assert t.peer_proof is False

    assert srv.info()["proofs_ok"] == 0 and srv.info()["xfers_ok"] == 2
