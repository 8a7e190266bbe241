"""Worker B reuses worker A's chunks through LMCache's RemoteBackend and this plugin."""

from __future__ import annotations

import asyncio
import logging
import random

import torch

from conftest_helpers import SMALL, allocated_bytes, filled, payload, put_and_wait
from lmcache_valkey.integrations.lmcache.stack import Layout


def test_put_lookup_and_every_get_flavour_are_byte_exact(valkey_server, make_stack):
    stack = make_stack({"url": valkey_server.url, "tenant": "t1", "tenant_secret": "t1-secret-0123456789abcdef"})
    remote, lay = stack.remote, stack.layout
    assert stack.connector is not None, "plugin failed to start"
    keys = [lay.key(1000 + i) for i in range(6)]
    objs = [filled(stack, i) for i in range(6)]
    expected = [payload(o) for o in objs]
    put_and_wait(stack, keys, objs)
    assert all(o.get_ref_count() == 1 for o in objs), "put must not drop or keep the caller's reference"

    assert remote.contains(keys[0])
    assert not remote.contains(lay.key(999))
    assert remote.batched_contains(keys) == 6
    assert remote.batched_contains(keys[:3] + [lay.key(999)] + keys[3:]) == 3

    one = remote.get_blocking(keys[2])
    assert payload(one) == expected[2] and one.get_ref_count() == 1
    one.ref_count_down()

    many = remote.batched_get_blocking(keys + [lay.key(999)])
    assert [payload(m) for m in many[:6]] == expected and many[6] is None
    for m in many[:6]:
        m.ref_count_down()

    fut = asyncio.run_coroutine_threadsafe(
        remote.batched_get_non_blocking("lookup-1", keys[:2] + [lay.key(999)] + keys[2:]), stack.loop
    )
    prefix = fut.result(10)
    assert [payload(m) for m in prefix] == expected[:2]
    for m in prefix:
        m.ref_count_down()

    n = asyncio.run_coroutine_threadsafe(remote.batched_async_contains("lookup-2", keys), stack.loop).result(10)
    assert n == 6
    assert remote.remove(keys[0]) and not remote.contains(keys[0])
    for o in objs:
        o.ref_count_down()


def test_reference_counts_balance_over_a_thousand_operations(valkey_server, make_stack):
    stack = make_stack({"url": valkey_server.url})
    remote, lay = stack.remote, stack.layout
    baseline = allocated_bytes(stack)
    rng = random.Random(7)
    stored: dict[int, bytes] = {}
    ops = 0
    while ops < 1000:
        op = rng.choice(["put", "get", "batch", "contains"])
        if op == "put" or not stored:
            ids = [rng.randrange(40) for _ in range(4)]
            objs = [filled(stack, i) for i in ids]
            put_and_wait(stack, [lay.key(i) for i in ids], objs)
            for i, o in zip(ids, objs):
                stored[i] = payload(o)
                o.ref_count_down()
        elif op == "get":
            i = rng.randrange(45)
            got = remote.get_blocking(lay.key(i))
            assert (got is None) == (i not in stored)
            if got is not None:
                assert payload(got) == stored[i]
                got.ref_count_down()
        elif op == "batch":
            ids = [rng.randrange(45) for _ in range(5)]
            for i, got in zip(ids, remote.batched_get_blocking([lay.key(i) for i in ids])):
                assert (got is None) == (i not in stored)
                if got is not None:
                    assert payload(got) == stored[i]
                    got.ref_count_down()
        else:
            remote.batched_contains([lay.key(i) for i in range(10)])
        ops += 1
    assert allocated_bytes(stack) == baseline, "a MemoryObj leaked (or was freed twice)"


def test_large_chunks_of_a_llama_8b_layout_round_trip(valkey_server, make_stack):
    lay = Layout(model="llama-8b-like", num_layers=32, num_kv_heads=8, head_dim=128, chunk_size=32)
    assert lay.chunk_bytes == 4 << 20
    stack = make_stack({"url": valkey_server.url}, layout=lay, cpu_gb=0.2)
    keys = [lay.key(i) for i in range(4)]
    objs = [filled(stack, i) for i in range(4)]
    want = [payload(o) for o in objs]
    put_and_wait(stack, keys, objs)
    got = stack.remote.batched_get_blocking(keys)
    assert [payload(g) for g in got] == want
    for o in objs + got:
        o.ref_count_down()


def test_partial_last_chunk_comes_back_with_its_own_length(valkey_server, make_stack):
    stack = make_stack({"url": valkey_server.url})
    lay = stack.layout
    obj = stack.local_cpu.allocate(stack.metadata.get_shapes(5), stack.metadata.get_dtypes(), stack.connector_fmt())
    obj.tensor.view(torch.uint8).view(-1).copy_(torch.arange(obj.get_size()) % 251)
    want = payload(obj)
    put_and_wait(stack, [lay.key(5)], [obj])
    got = stack.remote.get_blocking(lay.key(5))
    assert got is not None and payload(got) == want and got.meta.shape[2] == 5
    got.ref_count_down()
    obj.ref_count_down()


def test_another_models_chunks_never_hit(valkey_server, make_stack):
    a = make_stack({"url": valkey_server.url})
    b = make_stack({"url": valkey_server.url, "model_revision": "v2"})  # same model name, other revision
    c = make_stack({"url": valkey_server.url}, layout=Layout(**{**SMALL.__dict__, "dtype": torch.float16}))
    assert all(s.connector is not None for s in (a, b, c))
    obj = filled(a, 1)
    put_and_wait(a, [a.layout.key(1)], [obj])
    obj.ref_count_down()
    assert a.remote.contains(a.layout.key(1))
    assert not b.remote.contains(b.layout.key(1)) and b.remote.get_blocking(b.layout.key(1)) is None
    assert not c.remote.contains(c.layout.key(1)) and c.remote.get_blocking(c.layout.key(1)) is None


def test_malformed_settings_fail_at_start_with_the_key_named(valkey_server, make_stack, caplog):
    with caplog.at_level(logging.ERROR):
        stack = make_stack({"url": valkey_server.url, "op_timeout_s": "fast"})
    assert stack.remote.connection is None  # LMCache swallowed it ...
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("remote_storage_plugin.valkey.op_timeout_s" in m for m in errors), errors  # ... but we said why


def test_two_processes_share_chunks(valkey_server, make_stack, tmp_path):
    """A separate process stores chunks; this one finds and reads them."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})
        from conftest_helpers import SMALL, filled, put_and_wait
        from lmcache_valkey.integrations.lmcache.stack import build_stack
        s = build_stack(SMALL, plugin_settings={{"url": {valkey_server.url!r}}}, cpu_gb=0.1)
        objs = [filled(s, 50 + i) for i in range(3)]
        put_and_wait(s, [SMALL.key(50 + i) for i in range(3)], objs)
        for o in objs:
            o.ref_count_down()
        s.close()
    """))
    subprocess.run([sys.executable, str(script)], check=True, timeout=120, capture_output=True)
    reader = make_stack({"url": valkey_server.url})
    assert reader.connector is not None
    baseline = allocated_bytes(reader)
    keys = [SMALL.key(50 + i) for i in range(3)]
    assert reader.remote.batched_contains(keys) == 3
    got = reader.remote.batched_get_blocking(keys)
    expected = [filled(reader, 50 + i) for i in range(3)]
    assert [payload(g) for g in got] == [payload(e) for e in expected]
    for o in got + expected:
        o.ref_count_down()
    assert allocated_bytes(reader) == baseline


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_rss_stays_flat_over_a_long_loop(valkey_server, make_stack):
    stack = make_stack({"url": valkey_server.url})
    lay = stack.layout
    keys = [lay.key(i) for i in range(8)]

    def cycle() -> None:
        objs = [filled(stack, i) for i in range(8)]
        put_and_wait(stack, keys, objs)
        for o in objs:
            o.ref_count_down()
        for g in stack.remote.batched_get_blocking(keys):
            g.ref_count_down()
        stack.remote.batched_contains(keys)

    for _ in range(50):  # warm up allocator pools, connection buffers, metric children
        cycle()
    before = _rss_bytes()
    for _ in range(300):  # 300 x (8 puts + 8 gets + 1 lookup)
        cycle()
    grown = _rss_bytes() - before
    assert grown < 16 << 20, f"RSS grew by {grown >> 20} MiB over 5,100 operations"
