"""LMCache's KV connector for vLLM's CPU platform: vLLM's paged CPU KV cache <-> MemoryObjs.

LMCache 0.5.x ships KV connectors for CUDA, XPU, MUSA and HPU only; on vLLM-CPU its
``CreateGPUConnector`` raises ``No supported cpu connector found.`` and LMCache serves every
request by recompute. This class is the one it lacks (hook.py hands it to LMCache).

The two layouts:

* vLLM-CPU: one tensor per layer, allocated ``[num_blocks, num_kv_heads, block_size,
  2*head_size]``; inside each (block, head) the first half holds K, the second V, each in the
  order the attention kernel of the layer's ISA wants (``vec``: K transposed, ``[head_size,
  block_size]``, V by token; ``amx``: both tiled and packed). Nothing outside vLLM's own kernel
  says where a token's element lands, so :func:`block_layout` asks the kernel: it writes
  numbered probe values with ``cpu_attn_reshape_and_cache`` into one scratch block and reads
  back where each (token, head, dim) went.
* LMCache (``MemoryFormat.KV_2LTD``): ``[2, num_layers, num_tokens, num_kv_heads*head_size]``,
  the layout every LMCache connector shares, so a chunk stored here is the same bytes a CUDA
  worker would store.

A chunk is loaded by vLLM's own writer, ``cpu_attn_reshape_and_cache``, one call per layer
(the chunk's K and V rows are the ``[tokens, heads, head_size]`` tensors the kernel takes from
an attention step): the bytes land exactly where vLLM's attention would have put them, for
every ISA, with the kernel's vectorized transposes (2x fewer cycles than strided copies for
``vec``'s transposed K; docs/throughput.md). A chunk is stored by strided copies per run of a
block's tokens where the kernel's order is a strided one, else by one ``index_select`` per
layer and per K/V over element offsets computed once per chunk, written straight into the
MemoryObj through ``out=``. Either way each byte is copied once; nothing is staged.

Imports vLLM's CPU attention kernel and ISA choice only (``_vllm_kernel``), when it binds.
"""

from __future__ import annotations

import threading
from typing import Any, List, Optional, Sequence

import torch

from .compat import GPUConnectorInterface, MemoryFormat


class KVLayoutError(ValueError):
    """vLLM handed KV caches this connector cannot read (names what it got and expected)."""


def _vllm_kernel() -> tuple[Any, Any]:
    """vLLM-CPU's ``cpu_attn_reshape_and_cache`` and its ISA choice (the fence on vLLM)."""
    try:
        from vllm import _custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except ImportError as e:
        raise KVLayoutError(f"the CPU KV connector needs vLLM-CPU's attention kernel: {e}") from None
    return ops.cpu_attn_reshape_and_cache, _get_attn_isa


def block_layout(dtype: torch.dtype, num_heads: int, head_size: int, block_size: int,
                 kv_cache_dtype: str = "auto", isa: Optional[str] = None) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(isa, K offsets, V offsets): where vLLM's kernel puts element (token, head, dim) of a
    block, as offsets from the start of that token's block, each ``[block_size, heads, dim]``.

    Asked of the kernel itself: it writes numbered probes into one scratch block, one base-256
    digit at a time (0..255 are exact in every KV dtype), so whatever order its ISA packs
    elements in, each lands where the kernel would put it. Anything that is not a permutation
    inside the block (a quantizing cache, an element of one head in another's region) is refused.
    """
    if kv_cache_dtype != "auto":
        raise KVLayoutError(f"the CPU KV connector moves unquantized KV caches only, not {kv_cache_dtype!r}")
    reshape_and_cache, get_isa = _vllm_kernel()
    isa = isa or get_isa(dtype, block_size, head_size, kv_cache_dtype)  # what the layers will use
    per_head = block_size * head_size
    count = block_size * num_heads * head_size
    ids = torch.arange(count, dtype=torch.int64).view(block_size, num_heads, head_size)
    slots = torch.arange(block_size, dtype=torch.int64)
    head_region = 2 * per_head
    found = {}
    for which in ("k", "v"):
        decoded = torch.zeros(num_heads * head_region, dtype=torch.int64)
        digits, place = 0, 1
        while place < count or digits == 0:
            scratch = torch.full((1, num_heads, block_size, 2 * head_size), -1.0, dtype=dtype)
            halves = scratch.view(1, num_heads, 2 * block_size, head_size).chunk(2, dim=2)
            probe = ((ids // place) % 256).to(dtype)
            other = torch.full_like(probe, -2.0)
            key, value = (probe, other) if which == "k" else (other, probe)
            reshape_and_cache(key, value, halves[0], halves[1], slots, isa, 1.0, 1.0, kv_cache_dtype)
            flat = scratch.reshape(-1).to(torch.float32)
            decoded += flat.clamp(min=0).to(torch.int64) * place
            written = flat >= 0
            digits, place = digits + 1, place * 256
        positions = torch.nonzero(written).view(-1)
        offsets = torch.full((count,), -1, dtype=torch.int64)
        offsets[decoded[positions]] = positions
        heads = torch.arange(num_heads).view(1, num_heads, 1)
        offsets = offsets.view(block_size, num_heads, head_size)
        if positions.numel() != count or bool((offsets < 0).any()) or bool(
                ((offsets // head_region) != heads).any()):
            raise KVLayoutError(f"vLLM-CPU's {isa} KV layout is not a permutation of each (block, head): "
                                "the CPU KV connector cannot read it")
        found[which] = offsets
    return isa, found["k"], found["v"]


def _strided_views(caches: Sequence[torch.Tensor], inner: torch.Tensor, s_block: int, s_head: int,
                   block_size: int, head_size: int) -> Optional[list[torch.Tensor]]:
    """Per layer a view [blocks, heads, tokens, dim] of K (or V), if the kernel's order inside a
    head's region (``inner``, [tokens, heads, dim]) is a strided one."""
    base = int(inner[0, 0, 0])
    s_tok = int(inner[1, 0, 0]) - base if block_size > 1 else 0
    s_dim = int(inner[0, 0, 1]) - base if head_size > 1 else 0
    tok = torch.arange(block_size).view(-1, 1, 1)
    dim = torch.arange(head_size).view(1, 1, -1)
    if not torch.equal(inner, (base + tok * s_tok + dim * s_dim).expand_as(inner)):
        return None
    shape = (caches[0].shape[0], caches[0].shape[1], block_size, head_size)
    return [c.as_strided(shape, (s_block, s_head, s_tok, s_dim), c.storage_offset() + base) for c in caches]


class _Binding:
    """vLLM's caches as the connector reads them, made once and swapped whole (LMCache may
    call from its offload or API-server threads too)."""

    __slots__ = ("caches", "flats", "block_size", "block_stride", "head_stride", "k_offsets", "v_offsets",
                 "isa", "limit", "k_views", "v_views", "halves", "write")

    def __init__(self, caches: Sequence[torch.Tensor], num_heads: int, head_size: int,
                 dtype: torch.dtype) -> None:
        expected = f"[num_blocks, {num_heads}, block_size, {2 * head_size}] of {dtype}"
        for layer, cache in enumerate(caches):
            if cache.dim() != 4 or cache.shape[1] != num_heads or cache.shape[3] != 2 * head_size:
                raise KVLayoutError(
                    f"vLLM's KV cache of layer {layer} has shape {tuple(cache.shape)}; the CPU KV "
                    f"connector reads vLLM-CPU's paged layout {expected}")
            if cache.dtype != dtype:
                raise KVLayoutError(
                    f"vLLM's KV cache of layer {layer} holds {cache.dtype}, LMCache's chunks {dtype}: "
                    "start vLLM and LMCache with the same KV dtype")
            if cache.device.type != "cpu":
                raise KVLayoutError(f"vLLM's KV cache of layer {layer} is on {cache.device}, not the CPU")
        shapes = {(tuple(c.shape), c.stride()) for c in caches}
        if len(shapes) != 1:
            raise KVLayoutError(f"vLLM's KV cache layers differ in shape or strides: {sorted(shapes)}")
        (shape, stride), = shapes
        num_blocks, _, block_size, _ = shape
        s_block, s_head, s_tok, s_elem = stride
        # Each (block, head) must be one dense run (the kernel's own view of it); the block
        # stride may be padded (a unified KV pool): offsets step over the padding.
        if s_elem != 1 or s_tok != 2 * head_size or s_head < 2 * block_size * head_size:
            raise KVLayoutError(f"vLLM's KV caches have strides {stride}: the CPU KV connector needs "
                                f"dense (block, head) interiors of {expected}")
        self.isa, k, v = block_layout(dtype, num_heads, head_size, block_size)
        self.write = _vllm_kernel()[0]
        # Per layer the (K, V) caches as vLLM's attention layer hands them to its kernel.
        self.halves = [tuple(c.as_strided((num_blocks, num_heads, 2 * block_size, head_size),
                                          (s_block, s_head, head_size, 1), c.storage_offset()).chunk(2, dim=2))
                       for c in caches]
        region = 2 * block_size * head_size
        k_inner, v_inner = k % region, v % region  # within the head's region
        heads = (torch.arange(num_heads) * s_head).view(1, num_heads, 1)
        # Offsets from the start of the token's block, with the real head stride.
        self.k_offsets, self.v_offsets = k_inner + heads, v_inner + heads
        size = (num_blocks - 1) * s_block + (num_heads - 1) * s_head + region
        self.flats = [c.as_strided((size,), (1,)) for c in caches]
        # Where the kernel's order inside a block is a strided one (vec, vec16: K by dim, V by
        # token), views [blocks, heads, tokens, dim] let a run of a block's tokens move as one
        # strided copy; otherwise (amx's packed tiles) element offsets are gathered.
        self.k_views = _strided_views(caches, k_inner, s_block, s_head, block_size, head_size)
        self.v_views = _strided_views(caches, v_inner, s_block, s_head, block_size, head_size)
        self.caches = list(caches)
        self.block_size, self.block_stride, self.head_stride = block_size, s_block, s_head
        self.limit = num_blocks * block_size

    def runs(self, slots: torch.Tensor) -> list[tuple[int, int, int, int]]:
        """(first token, block, first offset, length) of each run of tokens that sit one after
        another in one block (a chunk of a request's tokens is a few such runs)."""
        blocks = torch.div(slots, self.block_size, rounding_mode="floor")
        starts = torch.ones(slots.numel(), dtype=torch.bool)
        if slots.numel() > 1:
            starts[1:] = (slots[1:] != slots[:-1] + 1) | (blocks[1:] != blocks[:-1])
        first = torch.nonzero(starts).view(-1).tolist()
        ends = first[1:] + [slots.numel()]
        slot_list = slots.tolist()
        return [(t, slot_list[t] // self.block_size, slot_list[t] % self.block_size, e - t)
                for t, e in zip(first, ends)]

    def matches(self, caches: Sequence[torch.Tensor]) -> bool:
        return len(caches) == len(self.caches) and all(a is b for a, b in zip(caches, self.caches))

    def offsets(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Element offsets of the tokens in ``slots``, (token, head, dim)-major as LMCache's
        ``[tokens, heads*head_size]`` rows run: K's, then V's."""
        blocks = torch.div(slots, self.block_size, rounding_mode="floor")
        inside = slots - blocks * self.block_size
        base = (blocks * self.block_stride).view(-1, 1, 1)
        return (base + self.k_offsets[inside]).view(-1), (base + self.v_offsets[inside]).view(-1)


class VLLMPagedCPUConnector(GPUConnectorInterface):
    """LMCache KV connector (``GPUConnectorInterface``) for vLLM's paged KV cache on the CPU.

    kwargs as LMCache's vLLM adapter passes them to its CUDA connector: ``kvcaches`` (one
    tensor per layer), ``slot_mapping`` (the whole sequence's slots) and, on load,
    ``vllm_cached_tokens`` (tokens vLLM already holds: never rewritten, they may be blocks
    another running request shares).
    """

    def __init__(self, num_layers: int, num_heads: int, head_size: int, dtype: torch.dtype) -> None:
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_size = head_size
        self.hidden_dim_size = num_heads * head_size
        self.dtype = dtype
        self._binding: Optional[_Binding] = None
        self._bind_lock = threading.Lock()

    @property
    def kvcaches(self) -> Optional[List[torch.Tensor]]:
        binding = self._binding
        return None if binding is None else binding.caches

    @property
    def isa(self) -> Optional[str]:
        """The attention kernel's ISA whose layout the bound caches hold (None before binding)."""
        binding = self._binding
        return None if binding is None else binding.isa

    @classmethod
    def from_metadata(cls, metadata: Any) -> "VLLMPagedCPUConnector":
        """Sizes from ``LMCacheMetadata.kv_shape`` = (layers, 2, chunk_size, kv_heads, head_size)."""
        if getattr(metadata, "use_mla", False):
            raise KVLayoutError("the CPU KV connector does not read MLA caches (vLLM-CPU has none)")
        num_layers, _, _, num_heads, head_size = (int(d) for d in metadata.kv_shape)
        return cls(num_layers, num_heads, head_size, metadata.kv_dtype)

    # --- LMCache's interface ---------------------------------------------------------------
    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.num_layers, num_tokens, self.hidden_dim_size])

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        """vLLM's blocks -> ``memory_obj`` (tokens ``start:end`` of the sequence)."""
        dst = self._chunk_tensor(memory_obj, end - start)
        binding, slots = self._slots(kwargs, start, end)
        shaped = dst.view(2, self.num_layers, end - start, self.num_heads, self.head_size)
        self._gather(binding, slots, shaped)
        memory_obj.metadata.fmt = MemoryFormat.KV_2LTD

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        """``memory_obj`` -> vLLM's blocks, past the tokens vLLM already holds."""
        if memory_obj.metadata.fmt != MemoryFormat.KV_2LTD:
            raise KVLayoutError(f"the CPU KV connector loads KV_2LTD chunks, got {memory_obj.metadata.fmt}")
        src = self._chunk_tensor(memory_obj, end - start)
        skip = min(end - start, max(0, int(kwargs.get("vllm_cached_tokens", 0)) - start))
        if skip == end - start:
            return
        binding, slots = self._slots(kwargs, start + skip, end)
        shaped = src.view(2, self.num_layers, end - start, self.num_heads, self.head_size)[:, :, skip:]
        for layer, (k_cache, v_cache) in enumerate(binding.halves):
            # As an attention step writes its tokens' K and V (unit scales: unquantized caches only).
            binding.write(shaped[0, layer], shaped[1, layer], k_cache, v_cache, slots, binding.isa, 1.0, 1.0, "auto")

    def _gather(self, binding: "_Binding", slots: torch.Tensor, chunk: torch.Tensor) -> None:
        """Every element of ``slots``' tokens from vLLM's blocks into ``chunk`` [2, layers, tokens, heads, dim], once."""
        runs = binding.runs(slots) if binding.k_views is not None or binding.v_views is not None else None
        offsets = binding.offsets(slots) if binding.k_views is None or binding.v_views is None else None
        for kv, views in ((0, binding.k_views), (1, binding.v_views)):
            if views is not None:
                for layer, view in enumerate(views):
                    for t, block, offset, n in runs:
                        chunk[kv, layer, t:t + n].copy_(view[block, :, offset:offset + n].transpose(0, 1))
                continue
            for layer, flat in enumerate(binding.flats):
                torch.index_select(flat, 0, offsets[kv], out=chunk[kv, layer].view(-1))

    def batched_from_gpu(self, memory_objs: Sequence[Any], starts: Sequence[int],
                         ends: Sequence[int], **kwargs: Any) -> None:
        for memory_obj, start, end in zip(memory_objs, starts, ends):
            self.from_gpu(memory_obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None,
                       **kwargs: Any) -> None:
        for memory_obj, start, end in zip(memory_objs, starts, ends):
            self.to_gpu(memory_obj, start, end, **kwargs)

    # --- internals ---------------------------------------------------------------------------
    def _chunk_tensor(self, memory_obj: Any, num_tokens: int) -> torch.Tensor:
        tensor = memory_obj.tensor
        want = self.get_shape(num_tokens)
        if tensor is None or tuple(tensor.shape) != tuple(want) or not tensor.is_contiguous():
            got = None if tensor is None else tuple(tensor.shape)
            raise KVLayoutError(f"LMCache's chunk has shape {got}, the CPU KV connector expected "
                                f"a contiguous {tuple(want)}")
        if tensor.dtype != self.dtype:
            raise KVLayoutError(f"LMCache's chunk holds {tensor.dtype}, vLLM's KV cache {self.dtype}")
        return tensor

    def _slots(self, kwargs: dict, start: int, end: int) -> tuple[_Binding, torch.Tensor]:
        binding = self._binding
        caches = kwargs.get("kvcaches")
        if caches is not None and (binding is None or not binding.matches(caches)):
            binding = self._bind(caches)
        if binding is None:
            raise KVLayoutError("LMCache passed no 'kvcaches' to the CPU KV connector")
        if "slot_mapping" not in kwargs:
            raise KVLayoutError("LMCache passed no 'slot_mapping' to the CPU KV connector")
        slots = kwargs["slot_mapping"][start:end].to(torch.int64)
        if slots.numel() != end - start:
            raise KVLayoutError(f"slot_mapping[{start}:{end}] does not map every token to a slot")
        if slots.numel() and (bool((slots < 0).any()) or int(slots.max()) >= binding.limit):
            raise KVLayoutError(f"slot_mapping holds slots outside vLLM's {binding.limit} KV slots")
        return binding, slots

    def _bind(self, caches: Sequence[torch.Tensor]) -> _Binding:
        """Offsets into vLLM's caches, made once (vLLM allocates them once, at start-up)."""
        with self._bind_lock:
            if self._binding is not None and self._binding.matches(caches):
                return self._binding
            if len(caches) != self.num_layers:
                raise KVLayoutError(f"vLLM handed {len(caches)} KV cache layers, LMCache's metadata "
                                    f"says {self.num_layers}")
            self._binding = _Binding(list(caches), self.num_heads, self.head_size, self.dtype)
            return self._binding
