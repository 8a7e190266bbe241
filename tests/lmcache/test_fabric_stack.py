"""Through LMCache's storage stack: chunks move by libfabric RMA between the arena and the endpoint."""

from __future__ import annotations


import shutil

import pytest

from conftest_helpers import allocated_bytes, filled, payload, put_and_wait
from lmcache_valkey.integrations.lmcache.stack import Layout
from support.servers import DEBIAN_VALKEY, ValkeyCluster, ValkeyServer, endpoint_args, make_tls_files


@pytest.mark.parametrize("transport", ["fabric", "blob-tcp"])
@pytest.mark.parametrize("chunk_size,n", [(32, 6), (256, 3)])  # 4 MiB and 32 MiB chunks
def test_large_object_put_and_get_through_lmcache_are_byte_exact(blob_server, make_stack, chunk_size, n, transport):
    """Both large-object transports: RMA into LMCache's arena, and BLOB.TCP_* inline."""
    lay = Layout(model=transport, num_layers=32, num_kv_heads=8, head_dim=128, chunk_size=chunk_size)
    stack = make_stack({"url": blob_server.url, "transport": transport, "fabric_provider": "tcp;ofi_rxm"},
                       layout=lay, cpu_gb=0.5 if chunk_size == 32 else 0.8)
    assert stack.connector is not None and stack.connector.store.transport_name == transport
    baseline = allocated_bytes(stack)
    keys = [lay.key(i) for i in range(n)]
    objs = [filled(stack, i) for i in range(n)]
    want = [payload(o) for o in objs]
    put_and_wait(stack, keys, objs)
    for o in objs:
        o.ref_count_down()
    assert stack.remote.batched_contains(keys) == n
    got = stack.remote.batched_get_blocking(keys)
    assert [payload(g) for g in got] == want
    one = stack.remote.get_blocking(keys[-1])
    assert payload(one) == want[-1]
    for g in got + [one]:
        g.ref_count_down()
    assert allocated_bytes(stack) == baseline
    if transport == "fabric":
        moved = stack.connector.store.transport.stats
        assert moved.get("bulk_fallbacks", 0) == 0, moved  # the bytes went by RMA, not the TCP fallback
    assert blob_server.cmd("TYPE", stack.connector.store.namespace.data_key(
        stack.connector.store.namespace.chunk_id(keys[0].to_string()))) != b"string"


@pytest.fixture
def managed_cluster(tmp_path):
    """Three primaries with TLS required on every connection and on the cluster bus (set up
    before, and stopped after, the stacks that use it)."""
    if not shutil.which(DEBIAN_VALKEY):
        pytest.skip(f"{DEBIAN_VALKEY} (TLS build) not installed")
    with ValkeyCluster(3, binary=DEBIAN_VALKEY, tls=make_tls_files(tmp_path / "tls"), args=endpoint_args(64)) as c:
        yield c


@pytest.mark.parametrize("transport", ["fabric", "blob-tcp"])
def test_a_managed_style_cluster_with_tls_serves_lmcache_over_large_objects(managed_cluster, make_stack, transport):
    """The setup of a managed large-object Valkey: three primaries, TLS required on every
    connection and on the cluster bus; LMCache's chunks spread over every shard and come back
    byte-exact through both large-object transports."""
    c = managed_cluster
    lay = Layout(model=f"managed-{transport}", num_layers=8, num_kv_heads=8, head_dim=128, chunk_size=32)
    stack = make_stack({"url": c.url, "tls_ca_file": c.tls.ca_file, "transport": transport,
                        "fabric_provider": "tcp;ofi_rxm", "fabric_bind_addr": "127.0.0.1"}, layout=lay)
    store = stack.connector.store
    assert store.transport_name == transport
    assert type(store.transport).__name__ == ("ClusterFabricTransport" if transport == "fabric" else "BlobTcpClient")
    if transport == "blob-tcp":
        assert store.transport.is_cluster
    baseline = allocated_bytes(stack)
    keys = [lay.key(i) for i in range(12)]
    objs = [filled(stack, i) for i in range(len(keys))]
    want = [payload(o) for o in objs]
    put_and_wait(stack, keys, objs)
    for o in objs:
        o.ref_count_down()
    assert stack.remote.batched_contains(keys) == len(keys)
    got = stack.remote.batched_get_blocking(keys)
    assert [payload(g) for g in got] == want
    for g in got:
        g.ref_count_down()
    assert allocated_bytes(stack) == baseline
    per_node = [s.cmd("DBSIZE") for s in c.servers]
    assert sum(1 for n in per_node if n) >= 2, per_node  # the chunks spread over the shards


def test_auto_uses_fabric_when_the_endpoint_answers_and_tcp_otherwise(blob_server, valkey_server, make_stack):
    lay = Layout(model="auto", num_layers=4, num_kv_heads=2, head_dim=64, chunk_size=16)
    with_module = make_stack({"url": blob_server.url, "transport": "auto"}, layout=lay)
    plain = make_stack({"url": valkey_server.url, "transport": "auto"}, layout=lay)
    assert with_module.connector.store.transport_name == "fabric"
    assert plain.connector.store.transport_name == "resp"
    for stack in (with_module, plain):
        obj = filled(stack, 3)
        want = payload(obj)
        put_and_wait(stack, [lay.key(3)], [obj])
        obj.ref_count_down()
        got = stack.remote.get_blocking(lay.key(3))
        assert payload(got) == want
        got.ref_count_down()


def test_sigterm_still_shuts_the_server_down_cleanly_with_the_module_loaded(make_stack):
    """libfabric replaces Valkey's SIGTERM handler when it loads; the module takes the signal
    back and runs SHUTDOWN, and stops its fabric thread first: exit status 0, after RMA traffic."""
    import signal

    server = ValkeyServer(args=endpoint_args(64)).start()
    try:
        lay = Layout(model="exit", num_layers=4, num_kv_heads=2, head_dim=64, chunk_size=16)
        stack = make_stack({"url": server.url, "transport": "fabric"}, layout=lay)
        obj = filled(stack, 1)
        put_and_wait(stack, [lay.key(1)], [obj])
        obj.ref_count_down()
        got = stack.remote.get_blocking(lay.key(1))
        got.ref_count_down()
        proc = server.proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, f"valkey-server exited with {proc.returncode}"
    finally:
        server.stop()
        server.cleanup()


def test_a_worker_keeps_its_own_signal_handlers_after_loading_libfabric(tmp_path):
    """libfabric installs SIGINT/SIGTERM handlers when loaded; the worker's must survive."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        from lmcache_valkey.transport.fabric import FabricEndpoint
        ep = FabricEndpoint("tcp;ofi_rxm", "127.0.0.1")
        seen = []
        signal.signal(signal.SIGTERM, lambda *a: seen.append("term"))
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            seen.append("int")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        ep.close()
        print(",".join(seen))
    """))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "int,term"
