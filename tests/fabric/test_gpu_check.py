"""benchmarks/gpu_check.sh on a machine without a GPU: every step but the GPU ones runs for
real (endpoint and binding builds, host-memory RMA and RESP through a real server, the
table), and every GPU row says it was not run -- never a number (docs/gpu-check.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| check |"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def test_dry_run_measures_host_paths_and_runs_no_gpu_step(module_so, tmp_path):
    out = tmp_path / "table.md"
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_check.sh"), "--dry-run", "--quick", "--python", sys.executable,
         "--bundle", str(tmp_path / "no-bundle"), "--out", str(out), "--logs", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text() == proc.stdout
    rows = table_rows(proc.stdout)

    assert rows["GPU"][0] == "none (--dry-run)"
    assert rows["libfabric"][1] == "system"
    for name, cells in rows.items():
        if name.startswith("step: "):
            assert cells[0] == "ok", (name, cells)
    for size in (4, 32):
        for check in (f"host RMA tcp;ofi_rxm {size} MiB", f"RESP {size} MiB"):
            result, numbers = rows[check][:2]
            assert result == "byte-exact", (check, rows[check])
            assert "SET" in numbers and "GET" in numbers and "GB/s" in numbers
    gpu_rows = [n for n in rows if n.startswith(("GPU RMA", "LMCache", "TTFT"))]
    assert len(gpu_rows) >= 5
    for name in gpu_rows:
        assert rows[name] == ["not run (no GPU)", "", ""], (name, rows[name])
    assert not [n for n, cells in rows.items() if cells[0].startswith(("failed", "stopped", "MISMATCH"))]
    assert (tmp_path / "logs" / "driver.log").exists()


def test_kv_through_vllm_pages_gives_the_recomputed_first_token(tmp_path):
    """The TTFT hit path of the check, on CPU with a tiny model: KV written to vLLM-layout
    pages and read back into a transformers cache continues the prompt exactly as
    recomputing it does."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import gpu_check as g

    shape = g.QUICK_SHAPE
    model = g.load_model(g.make_model_dir(shape, tmp_path / "model", "cpu"), "cpu")
    n = 2 * g.CHUNK
    prompt = torch.randint(0, shape.vocab, (n + g.SUFFIX,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(input_ids=prompt[None], use_cache=True, logits_to_keep=1)
    pages = g.new_pages(shape, len(prompt), "cpu")
    g.hf_to_paged(full.past_key_values, shape.layers, n, pages)
    cache = g.paged_to_hf(pages, n)
    for i in range(shape.layers):
        k, v = g.layer_kv(full.past_key_values, i)
        k2, v2 = g.layer_kv(cache, i)
        assert torch.equal(k[:, :, :n], k2) and torch.equal(v[:, :, :n], v2)
    with torch.no_grad():
        rest = model(input_ids=prompt[None, n:], past_key_values=cache, use_cache=True, logits_to_keep=1)
    assert int(rest.logits[0, -1].argmax()) == int(full.logits[0, -1].argmax())


@pytest.mark.parametrize("transport", ["tcp", "fabric"])
def test_the_checks_lmcache_engine_stores_and_retrieves_prefixes_through_the_plugin(module_so, transport, monkeypatch):
    """The LMCache engine the check builds (config, metadata, this plugin as remote storage,
    nothing kept in local CPU memory) on a CPU machine: LMCache's own MockGPUConnector
    stands in for its CUDA connector, so only the storage side is exercised here."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("lmcache")
    import gpu_check as g
    import lmcache.v1.gpu_connector.gpu_connectors as connectors
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector
    from support.servers import ValkeyServer, endpoint_args

    class CpuStandIn:
        @staticmethod
        def from_metadata(metadata, use_gpu=False, device=None):
            return MockGPUConnector(metadata.kv_shape)

    monkeypatch.setattr(connectors, "VLLMPagedMemGPUConnectorV2", CpuStandIn)
    name = f"test-gpu-check-{transport}"
    with ValkeyServer(args=endpoint_args(arena_mb=128)) as srv:
        engine = g.build_engine(g.QUICK_SHAPE, srv.port, transport, 1024, name)
        try:
            prefix = torch.randint(0, 1000, (2 * g.CHUNK,))
            prompt = torch.cat([prefix, torch.randint(0, 1000, (g.SUFFIX,))])
            assert engine.lookup(prompt) == 0
            engine.store(prefix, kvcaches=[], slot_mapping=torch.arange(len(prefix)))
            assert g.wait_stored(engine, prefix, 60) == len(prefix)
            assert int(engine.retrieve(prompt, kvcaches=[], slot_mapping=torch.arange(len(prompt))).sum()) == len(prefix)
            assert int(srv.cmd("DBSIZE")) >= 2  # the two chunks live in Valkey
        finally:
            LMCacheEngineBuilder.destroy(name)
