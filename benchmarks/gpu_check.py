"""The GPU-side paths, measured on one machine, as one markdown table (docs/gpu-check.md).

Run by benchmarks/gpu_check.sh, which prepares libfabric, the endpoint module and the
Python packages first; by hand:

    python benchmarks/gpu_check.py run --module endpoint/build/lmcv_blob.so [--dry-run] [--quick]
    python benchmarks/gpu_check.py probe-hmem          # exit 0 when a provider registers CUDA memory

Sections, each under its own deadline, each a set of rows (a failure is a row, never an abort):

* fabric: per provider, values of 4 and 32 MiB through the endpoint module and back,
  byte-exact, in host memory and (FI_HMEM) in CUDA memory, SET and GET GB/s;
* resp: the same values over RESP (this package's client) on the same server;
* lmcache: LMCache's engine with its vLLM GPU connector storing and loading KV through this
  plugin (byte-exact), and time to first token of a Llama-shaped model with random weights
  saved locally, hit (KV loaded through the plugin) vs recompute, at 8K and 32K tokens.

GPU rows say "not run (no GPU)" where there is no GPU (or with --dry-run); no number is
ever made up. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MiB = 1 << 20
NO_GPU = "not run (no GPU)"
RMA_PROVIDERS = ("tcp;ofi_rxm", "tcp", "shm")  # the loopback ones; each where fi_info lists it
SIZES = (4 * MiB, 32 * MiB)


# -- the table ---------------------------------------------------------------------------------


@dataclass
class Table:
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)

    def add(self, check: str, result: str, numbers: str = "", notes: str = "") -> None:
        self.rows.append((check, result, numbers, notes))
        print(f"[gpu_check] {check}: {result} {numbers} {notes}".rstrip(), file=sys.stderr, flush=True)

    def markdown(self) -> str:
        def cell(s: str) -> str:
            return " ".join(s.replace("|", "\\|").split())

        out = ["| check | result | numbers | notes |", "|---|---|---|---|"]
        out += [f"| {' | '.join(cell(c) for c in row)} |" for row in self.rows]
        return "\n".join(out) + "\n"


def short(exc: BaseException, n: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f}"


class Section:
    """Runs one section under a deadline in a thread: a hang is a row, not a stuck run."""

    def __init__(self, table: Table, name: str, deadline_s: float) -> None:
        self.table, self.name, self.deadline_s = table, name, deadline_s

    def run(self, fn: Callable[[], None]) -> None:
        err: list[BaseException] = []

        def body() -> None:
            try:
                fn()
            except BaseException as exc:  # reported as a row
                err.append(exc)

        t = threading.Thread(target=body, name=f"section-{self.name}", daemon=True)
        t.start()
        t.join(self.deadline_s)
        if t.is_alive():
            self.table.add(self.name, f"stopped: over its {self.deadline_s:.0f} s budget")
        elif err:
            self.table.add(self.name, "failed", notes=short(err[0], 300))


# -- servers -------------------------------------------------------------------------------------


class Servers:
    """valkey-server processes with the endpoint module, stopped by PID. Started from the
    main thread: a server dies with the thread that started it (PR_SET_PDEATHSIG), and each
    section runs in a thread of its own."""

    def __init__(self, module: Path, workdir: Path) -> None:
        self.module, self.workdir = module, workdir.resolve()
        self.started: dict[str, Any] = {}
        self.failed: dict[str, str] = {}

    def start(self, name: str, provider: str, arena_mb: int = 512) -> None:
        from support.servers import ValkeyServer

        args = ["--loadmodule", str(self.module.resolve()), "provider", provider, "bind", "127.0.0.1",
                "arena_mb", str(arena_mb)]
        d = tempfile.mkdtemp(prefix="valkey-", dir=self.workdir)
        try:
            self.started[name] = ValkeyServer(args=args, workdir=d).start(timeout=30)
        except Exception as exc:
            self.failed[name] = short(exc, 300)

    def get(self, name: str) -> Any:
        if name not in self.started:
            raise RuntimeError(f"no server for {name}: {self.failed.get(name, 'not started')}")
        return self.started[name]

    def stop(self) -> None:
        for srv in self.started.values():
            with contextlib.suppress(Exception):
                srv.stop()


# -- timing ------------------------------------------------------------------------------------


def timed(reps: int, fn: Callable[[], Any]) -> float:
    """Median seconds of ``reps`` runs of ``fn`` (a synchronous call)."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# -- fabric: host and CUDA memory through the endpoint -------------------------------------------


def host_rma_rows(table: Table, servers: Servers, provider: str, reps: int) -> None:
    from lmcache_valkey.transport.fabric import FabricTransport

    srv = servers.get(provider)

    async def body() -> None:
        async with FabricTransport("127.0.0.1", srv.port, provider=provider, verify_crc=True) as t:
            for size in SIZES:
                arena = bytearray(2 * size)
                t.register_buffer(arena)
                mv = memoryview(arena)
                src, dst = mv[:size], mv[size:]
                src[:] = os.urandom(size)
                key = f"host-{size}".encode()
                set_s = await atimed(reps, lambda: t.set_from(key, [src], None, 60))
                get_s = await atimed(reps, lambda: t.get_into(key, [dst], 60))
                exact = bytes(src) == bytes(dst)
                table.add(f"host RMA {provider} {size // MiB} MiB", "byte-exact" if exact else "MISMATCH",
                          f"SET {gbps(size, set_s)} GB/s, GET {gbps(size, get_s)} GB/s",
                          f"server fi_read/fi_write into registered host memory; median of {reps}")

    asyncio.run(body())


async def atimed(reps: int, make: Callable[[], Any]) -> float:
    """Median seconds of ``reps`` awaits of ``make()``, after one untimed (connections, keys)."""
    await make()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await make()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gpu_rma_rows(table: Table, servers: Servers, provider: str, reps: int) -> None:
    import torch

    from lmcache_valkey.transport.fabric import FabricTransport, RawSpan

    srv = servers.get(provider)
    dev = torch.cuda.current_device()

    async def body() -> None:
        try:
            t = FabricTransport("127.0.0.1", srv.port, provider=provider, hmem=True)
        except Exception as exc:
            for size in SIZES:
                table.add(f"GPU RMA {provider} {size // MiB} MiB (FI_HMEM)", "failed", notes=f"FI_HMEM endpoint: {short(exc)}")
            return
        async with t:
            for size in SIZES:
                name = f"GPU RMA {provider} {size // MiB} MiB (FI_HMEM)"
                src = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda")
                dst = torch.zeros(size, dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
                try:
                    t0 = time.perf_counter()
                    t.register(src.data_ptr(), size, cuda_device=dev)
                    t.register(dst.data_ptr(), size, cuda_device=dev)
                    reg_ms = (time.perf_counter() - t0) * 500  # per registration
                except Exception as exc:
                    table.add(name, "failed", notes=f"CUDA registration: {short(exc)}")
                    continue
                key = f"gpu-{size}".encode()
                try:
                    set_s = await atimed(reps, lambda: t.set_from(key, [RawSpan(src.data_ptr(), size, owner=src)], None, 60))
                    get_s = await atimed(reps, lambda: t.get_into(key, [RawSpan(dst.data_ptr(), size, owner=dst)], 60))
                except Exception as exc:
                    table.add(name, "failed", notes=f"transfer: {short(exc)}")
                    continue
                torch.cuda.synchronize()
                exact = bool(torch.equal(src, dst))
                table.add(name, "byte-exact" if exact else "MISMATCH",
                          f"SET {gbps(size, set_s)} GB/s, GET {gbps(size, get_s)} GB/s",
                          f"GPU → endpoint → GPU; registration {reg_ms:.1f} ms; median of {reps}")

    asyncio.run(body())


def resp_rows(table: Table, servers: Servers, provider: str, reps: int) -> None:
    from lmcache_valkey.config import settings_from_mapping
    from lmcache_valkey.transport.resp.client import RespClient

    srv = servers.get(provider)

    async def body() -> None:
        client = RespClient(settings_from_mapping({"url": srv.url}, env={}))
        await client.start()
        try:
            for size in SIZES:
                payload = os.urandom(size)
                dst = bytearray(size)
                key = f"resp-{size}".encode()
                set_s = await atimed(reps, lambda: client.set(key, [payload], ttl_s=None, timeout=60))
                get_s = await atimed(reps, lambda: client.get_into(key, [memoryview(dst)], timeout=60))
                table.add(f"RESP {size // MiB} MiB", "byte-exact" if bytes(dst) == payload else "MISMATCH",
                          f"SET {gbps(size, set_s)} GB/s, GET {gbps(size, get_s)} GB/s",
                          f"this package's RESP client, host memory, same server; median of {reps}")
        finally:
            await client.close()

    asyncio.run(body())


def fabric_section(table: Table, servers: Servers, providers: list[str], gpu: bool, reps: int) -> None:
    for provider in providers:
        try:
            host_rma_rows(table, servers, provider, reps)
        except Exception as exc:
            table.add(f"host RMA {provider}", "failed", notes=short(exc))
            continue  # no endpoint on this provider: no GPU row either
        if not gpu:
            for size in SIZES:
                table.add(f"GPU RMA {provider} {size // MiB} MiB (FI_HMEM)", NO_GPU)
            continue
        try:
            gpu_rma_rows(table, servers, provider, reps)
        except Exception as exc:
            table.add(f"GPU RMA {provider}", "failed", notes=short(exc))


# -- probe: can any provider register CUDA memory? ------------------------------------------------


def probe_hmem(providers: list[str]) -> list[tuple[str, str]]:
    """(provider, "ok" | why not) for each: open with FI_HMEM, register 1 MiB of CUDA memory."""
    import torch

    from lmcache_valkey.transport.fabric import FabricEndpoint

    buf = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    out = []
    for provider in providers:
        try:
            with FabricEndpoint(provider, hmem=True) as ep:
                ep.register(buf.data_ptr(), MiB, cuda_device=torch.cuda.current_device())
            out.append((provider, "ok"))
        except Exception as exc:
            out.append((provider, short(exc)))
    return out


# -- LMCache's GPU connector and time to first token ----------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """Llama-3-8B's per-layer geometry (GQA, 8 KV heads of 128) with fewer layers: the
    ratio of compute to KV bytes per token is the 8B's, the weights fit a quick save/load."""

    layers: int = 8
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    vocab: int = 32000

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16

    def describe(self) -> str:
        return (f"Llama-shaped, random weights: {self.layers} layers, hidden {self.hidden}, {self.heads} heads, "
                f"{self.kv_heads} KV heads × {self.head_dim}, bf16; KV {self.kv_bytes_per_token // 1024} KiB/token")


QUICK_SHAPE = ModelShape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, vocab=1000)
CHUNK = 256  # LMCache chunk_size
BLOCK = 16  # vLLM's page size
SUFFIX = 64  # the new question after the shared prefix


def make_model_dir(shape: ModelShape, where: Path, device: str) -> Path:
    """Writes a Llama config and random bf16 weights (seeded) to ``where``: a local model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, max_position_embeddings=65536, rope_theta=500000.0, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model.save_pretrained(where)
    del model
    return where


def load_model(path: Path, device: str) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.to(device).eval()


def hf_to_paged(cache: Any, layers: int, n_tokens: int, paged: list[Any]) -> None:
    """Copies the first ``n_tokens`` of a transformers cache (per layer [1, kv_heads, S, D])
    into vLLM flash-attention pages (per layer [2, blocks, BLOCK, kv_heads, D]), slot = token."""
    for i in range(layers):
        k, v = layer_kv(cache, i)
        flat = paged[i].view(2, -1, k.shape[1], k.shape[3])
        flat[0, :n_tokens].copy_(k[0, :, :n_tokens].transpose(0, 1))
        flat[1, :n_tokens].copy_(v[0, :, :n_tokens].transpose(0, 1))


def paged_to_hf(paged: list[Any], n_tokens: int) -> Any:
    """A transformers DynamicCache holding the first ``n_tokens`` slots of the pages."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, layer in enumerate(paged):
        flat = layer.view(2, -1, layer.shape[-2], layer.shape[-1])
        k = flat[0, :n_tokens].transpose(0, 1).unsqueeze(0).contiguous()
        v = flat[1, :n_tokens].transpose(0, 1).unsqueeze(0).contiguous()
        cache.update(k, v, i)
    return cache


def layer_kv(cache: Any, i: int) -> tuple[Any, Any]:
    if hasattr(cache, "layers"):  # transformers >= 4.54
        return cache.layers[i].keys, cache.layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


def new_pages(shape: ModelShape, n_tokens: int, device: str) -> list[Any]:
    import torch

    blocks = -(-n_tokens // BLOCK)
    return [torch.zeros(2, blocks, BLOCK, shape.kv_heads, shape.head_dim, dtype=torch.bfloat16, device=device)
            for _ in range(shape.layers)]


def build_engine(shape: ModelShape, port: int, transport: str, max_tokens: int, name: str) -> Any:
    """LMCache's engine with its vLLM paged GPU connector and this plugin as remote storage.
    The local CPU tier keeps nothing, so every hit is read through the plugin."""
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.gpu_connector.gpu_connectors import VLLMPagedMemGPUConnectorV2
    from lmcache.v1.metadata import LMCacheMetadata

    from lmcache_valkey.integrations.lmcache.stack import PLUGIN, plugin_extra_config

    kv_gb = 3 * max_tokens * shape.kv_bytes_per_token / 1e9 + 0.5
    config = LMCacheEngineConfig.from_dict({
        "chunk_size": CHUNK,
        "local_cpu": False,
        "max_local_cpu_size": round(kv_gb, 1),
        "remote_serde": "naive",
        "save_unfull_chunk": False,
        "blocking_timeout_secs": 60,
        "remote_storage_plugins": [PLUGIN],
        "extra_config": plugin_extra_config({
            "url": f"valkey://127.0.0.1:{port}", "transport": transport, "op_timeout_s": 60,
            "connections_per_node": 8, "fabric_provider": "tcp;ofi_rxm", "fabric_bind_addr": "127.0.0.1",
        }),
    })
    metadata = LMCacheMetadata(
        model_name=name, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
        kv_dtype=torch.bfloat16, kv_shape=(shape.layers, 2, CHUNK, shape.kv_heads, shape.head_dim), chunk_size=CHUNK,
    )
    connector = VLLMPagedMemGPUConnectorV2.from_metadata(metadata, use_gpu=False, device=torch.device("cuda"))
    engine = LMCacheEngineBuilder.get_or_create(name, config, metadata, connector, None, None)
    engine.post_init()
    return engine


def wait_stored(engine: Any, tokens: Any, deadline_s: float = 120.0) -> int:
    """Tokens LMCache finds for ``tokens`` once the plugin's asynchronous puts landed."""
    end = time.monotonic() + deadline_s
    found = 0
    while time.monotonic() < end:
        found = int(engine.lookup(tokens))
        if found >= len(tokens) // CHUNK * CHUNK:
            break
        time.sleep(0.05)
    return found


def lmcache_section(table: Table, servers: Servers, gpu: bool, quick: bool, workdir: Path, token_counts: list[int]) -> None:
    labels = [f"{n // 1024}K" for n in token_counts]
    if not gpu:
        table.add("LMCache GPU connector store/load via plugin", NO_GPU)
        for label in labels:
            table.add(f"TTFT {label} tokens: recompute vs hit", NO_GPU)
        return
    import torch

    ops = "compiled lmcache.cuda_ops"
    try:
        importlib.import_module("lmcache.cuda_ops")  # whether LMCache's compiled ops load here
    except ImportError as exc:
        ops = f"LMCache's torch fallback ops (lmcache.cuda_ops does not load here: {short(exc, 100)})"

    shape = QUICK_SHAPE if quick else ModelShape()
    t0 = time.perf_counter()
    model_dir = make_model_dir(shape, workdir / "model", "cuda")
    model = load_model(model_dir, "cuda")
    table.add("model", "random weights saved and loaded locally", f"{time.perf_counter() - t0:.1f} s",
              shape.describe())

    gen = torch.Generator().manual_seed(1)
    for transport in ("tcp", "fabric"):
        srv = servers.get("lmcache")
        name = f"gpu-check-{transport}"
        try:
            engine = build_engine(shape, srv.port, transport, max(token_counts) + SUFFIX, name)
        except Exception as exc:
            table.add(f"LMCache engine (plugin transport {transport})", "failed", notes=short(exc, 300))
            continue
        # The worker's paged KV cache, allocated once as vLLM does: the connector keeps
        # pointers to these tensors from its first call on.
        pages = new_pages(shape, max(token_counts) + SUFFIX, "cuda")
        try:
            for n, label in zip(token_counts, labels):
                prefix = torch.randint(0, shape.vocab, (n,), generator=gen)
                prompt = torch.cat([prefix, torch.randint(0, shape.vocab, (SUFFIX,), generator=gen)])
                ttft_rows(table, engine, model, shape, pages, prefix, prompt, label, transport, ops, reps=1 if quick else 3)
        finally:
            from lmcache.v1.cache_engine import LMCacheEngineBuilder

            with contextlib.suppress(Exception):
                LMCacheEngineBuilder.destroy(name)
            del pages
            torch.cuda.empty_cache()


def ttft_rows(table: Table, engine: Any, model: Any, shape: ModelShape, pages: list[Any], prefix: Any, prompt: Any,
              label: str, transport: str, ops: str, reps: int) -> None:
    import torch

    n = len(prefix)
    ids = prompt.to("cuda")[None]
    slots = torch.arange(len(prompt), dtype=torch.long, device="cuda")

    def recompute() -> tuple[Any, Any]:
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        first = out.logits[0, -1].argmax()
        torch.cuda.synchronize()
        return first, out.past_key_values

    recompute()  # warm-up (kernels, allocator)
    rec_s = timed(reps, recompute)
    first_rec, cache = recompute()

    # Store the prefix's KV the way vLLM's worker would: pages + slot mapping, through LMCache.
    hf_to_paged(cache, shape.layers, n, pages)
    del cache
    stored = [p.view(2, -1, *p.shape[-2:])[:, :n].clone() for p in pages]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.store(prefix, kvcaches=pages, slot_mapping=slots[:n])
    found = wait_stored(engine, prefix)
    store_s = time.perf_counter() - t0
    kv_bytes = n * shape.kv_bytes_per_token

    def clear() -> None:
        for p in pages:
            p.zero_()
        torch.cuda.synchronize()

    def load() -> int:
        return int(engine.retrieve(prompt, kvcaches=pages, slot_mapping=slots).sum())

    def hit() -> tuple[Any, int]:
        m = load()
        with torch.no_grad():
            out = model(input_ids=ids[:, m:], past_key_values=paged_to_hf(pages, m), use_cache=True, logits_to_keep=1)
        first = out.logits[0, -1].argmax()
        torch.cuda.synchronize()
        return first, m

    def timed_cleared(fn: Callable[[], Any]) -> tuple[float, Any]:
        times, result = [], None
        for _ in range(reps):
            clear()
            t0 = time.perf_counter()
            result = fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), result

    clear()
    if load() == 0:
        table.add(f"LMCache GPU connector store/load {label} via plugin ({transport})", "failed",
                  notes=f"nothing retrieved ({found} tokens found after store; store took {store_s:.1f} s)")
        return
    hit()  # warm-up
    load_s, m = timed_cleared(load)
    exact = m == n and all(torch.equal(p.view(2, -1, *p.shape[-2:])[:, :n], ref) for p, ref in zip(pages, stored))
    hit_s, (first_hit, _) = timed_cleared(hit)
    del stored
    table.add(f"LMCache GPU connector store/load {label} via plugin ({transport})",
              "byte-exact" if exact else f"MISMATCH (retrieved {m} of {n} tokens)",
              f"store {store_s * 1e3:.0f} ms, load {load_s * 1e3:.0f} ms ({gbps(kv_bytes, load_s)} GB/s)",
              f"{kv_bytes / MiB:.0f} MiB of KV, {found} tokens found after store; VLLMPagedMemGPUConnectorV2 "
              f"(vLLM flash-attention pages), {ops}")
    table.add(f"TTFT {label} tokens: recompute vs hit ({transport})",
              f"{rec_s / hit_s:.2f}× faster with the hit" if hit_s < rec_s else f"hit {hit_s / rec_s:.2f}× slower than recompute",
              f"recompute {rec_s * 1e3:.0f} ms, hit {hit_s * 1e3:.0f} ms",
              f"{label} shared prefix + {SUFFIX} new tokens; hit = LMCache retrieve through the plugin + prefill of the "
              f"rest; same first token: {'yes' if int(first_hit) == int(first_rec) else 'no'}; median of {reps}")


# -- entry points ------------------------------------------------------------------------------


def environment_rows(table: Table, gpu: bool, dry_run: bool, fi_info: Path | None, steps: Path | None) -> None:
    if gpu:
        import torch

        props = torch.cuda.get_device_properties(0)
        table.add("GPU", props.name, f"{props.total_memory / 2**30:.0f} GiB",
                  f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    else:
        why = " (--dry-run)" if dry_run else " (torch sees no CUDA device)"
        table.add("GPU", "none" + why, notes="GPU rows below: not run")
    if fi_info is not None and fi_info.exists():
        info = dict(line.split("=", 1) for line in fi_info.read_text().splitlines() if "=" in line)
        table.add("libfabric", info.get("version", "?"), info.get("source", ""),
                  f"providers: {info.get('providers', '?')}; FI_HMEM (fi_info -c FI_HMEM): {info.get('hmem', 'none') or 'none'}")
    if steps is not None and steps.exists():
        for line in steps.read_text().splitlines():
            name, seconds, status = (line.split("\t") + ["", ""])[:3]
            table.add(f"step: {name}", status, f"{float(seconds):.1f} s")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def cmd_run(args: argparse.Namespace) -> int:
    table = Table()
    gpu = not args.dry_run and cuda_available()
    workdir = Path(args.work or tempfile.mkdtemp(prefix="gpu-check-"))
    environment_rows(table, gpu, args.dry_run, args.fi_info, args.steps)
    listed = set(args.providers.split(",")) if args.providers else set(RMA_PROVIDERS)
    providers = [p for p in RMA_PROVIDERS if p in listed]
    reps = 2 if args.quick else 5
    servers = Servers(Path(args.module), workdir)
    for provider in providers:
        servers.start(provider, provider)
    tokens = [int(x) for x in args.tokens.split(",")]
    if gpu:  # LMCache's KV of the longest prompt, twice over (two transports), in the arena
        shape = QUICK_SHAPE if args.quick else ModelShape()
        servers.start("lmcache", "tcp;ofi_rxm", int(3 * max(tokens) * shape.kv_bytes_per_token / MiB) + 256)
    try:
        Section(table, "fabric", args.section_s).run(lambda: fabric_section(table, servers, providers, gpu, reps))
        Section(table, "RESP", 60).run(lambda: resp_rows(table, servers, providers[0] if providers else "tcp;ofi_rxm", reps))
        Section(table, "LMCache", args.lmcache_s).run(
            lambda: lmcache_section(table, servers, gpu, args.quick, workdir, tokens))
    finally:
        servers.stop()
    text = table.markdown()
    if args.table:
        Path(args.table).write_text(text)
    print(text, end="")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    if not cuda_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    results = probe_hmem(args.providers.split(","))
    for provider, why in results:
        print(f"{provider}: {why}", file=sys.stderr)
    return 0 if any(why == "ok" for _, why in results) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="all sections; prints the markdown table")
    r.add_argument("--module", default=str(ROOT / "endpoint/build/lmcv_blob.so"), help="the endpoint module (.so)")
    r.add_argument("--work", help="scratch folder (model, server dirs)")
    r.add_argument("--providers", default="", help="comma-separated providers fi_info lists (default: try all)")
    r.add_argument("--fi-info", type=Path, help="key=value lines gpu_check.sh wrote about libfabric")
    r.add_argument("--steps", type=Path, help="step\\tseconds\\tstatus lines gpu_check.sh timed")
    r.add_argument("--table", help="also write the table to this file")
    r.add_argument("--tokens", default="8192,32768", help="shared-prefix lengths for the TTFT rows")
    r.add_argument("--dry-run", action="store_true", help="no GPU step, even on a GPU machine")
    r.add_argument("--quick", action="store_true", help="fewer repetitions, a tiny model (tests)")
    r.add_argument("--section-s", type=float, default=90.0, help="budget of the fabric and RESP sections")
    r.add_argument("--lmcache-s", type=float, default=200.0, help="budget of the LMCache section")
    r.set_defaults(fn=cmd_run)
    q = sub.add_parser("probe-hmem", help="exit 0 when a provider registers CUDA memory")
    q.add_argument("--providers", default=",".join(RMA_PROVIDERS))
    q.set_defaults(fn=cmd_probe)
    args = p.parse_args()
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
