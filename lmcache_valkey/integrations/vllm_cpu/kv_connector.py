"""LMCache's KV connector for vLLM's CPU platform: vLLM's paged CPU KV cache <-> MemoryObjs.

LMCache 0.5.x ships KV connectors for CUDA, XPU, MUSA and HPU only; on vLLM-CPU its
``CreateGPUConnector`` raises ``No supported cpu connector found.`` and LMCache serves every
request by recompute. This class is the one it lacks (hook.py hands it to LMCache).

The two layouts (read off vLLM-CPU 0.32's ``cpu_attn.py``, which views the cache the same way):

* vLLM: one tensor per layer, allocated ``[num_blocks, num_kv_heads, block_size, 2*head_size]``
  but read as ``[num_blocks, num_kv_heads, 2, block_size, head_size]``: in each (block, head)
  the ``block_size`` K rows come first, then the ``block_size`` V rows.
* LMCache (``MemoryFormat.KV_2LTD``): ``[2, num_layers, num_tokens, num_kv_heads*head_size]``.

So a token's K (or V) for one head is one row of ``head_size`` elements in both. We view each
layer as a flat table of such rows (no copy, any block stride) and move a chunk with one
``index_select`` (store, written straight into the MemoryObj through ``out=``) or one
``index_copy_`` (load, written straight into vLLM's blocks) per layer and per K/V: each byte is
copied once, which the gather from scattered blocks forces; nothing is staged.

Never imports: vLLM (it is handed tensors), or anything of this package but the compat shim.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from .compat import GPUConnectorInterface, MemoryFormat


class KVLayoutError(ValueError):
    """vLLM handed KV caches this connector cannot read (names what it got and expected)."""


class _LayerRows:
    """One layer's KV cache seen as rows of ``head_size`` elements (a view, never a copy)."""

    __slots__ = ("rows", "block_stride", "head_stride", "source")

    def __init__(self, cache: torch.Tensor, num_heads: int, head_size: int, dtype: torch.dtype,
                 layer: int) -> None:
        expected = f"[num_blocks, {num_heads}, block_size, {2 * head_size}] of {dtype}"
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
        s_block, s_head, s_tok, s_elem = cache.stride()
        block_size = cache.shape[2]
        # Inside a (block, head) the 2*block_size rows must be dense; the block stride may be
        # padded (a unified KV pool), which the row view absorbs.
        if s_elem != 1 or s_tok != 2 * head_size or s_head % head_size or s_block % head_size:
            raise KVLayoutError(
                f"vLLM's KV cache of layer {layer} has strides {cache.stride()}: the CPU KV "
                f"connector needs dense (block, head) interiors of {expected}")
        last = (cache.shape[0] - 1) * s_block + (num_heads - 1) * s_head + 2 * block_size * head_size
        self.rows = cache.as_strided((last // head_size, head_size), (head_size, 1))
        self.block_stride = s_block // head_size
        self.head_stride = s_head // head_size
        self.source = cache


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
        self.kvcaches: Optional[List[torch.Tensor]] = None
        self._layers: list[_LayerRows] = []
        self._block_size = 0

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
        k_rows, v_rows = self._row_indices(kwargs, start, end)
        n = (end - start) * self.num_heads
        for layer, rows in enumerate(self._layers):
            torch.index_select(rows.rows, 0, k_rows, out=dst[0, layer].view(n, self.head_size))
            torch.index_select(rows.rows, 0, v_rows, out=dst[1, layer].view(n, self.head_size))
        memory_obj.metadata.fmt = MemoryFormat.KV_2LTD

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        """``memory_obj`` -> vLLM's blocks, past the tokens vLLM already holds."""
        if memory_obj.metadata.fmt != MemoryFormat.KV_2LTD:
            raise KVLayoutError(f"the CPU KV connector loads KV_2LTD chunks, got {memory_obj.metadata.fmt}")
        src = self._chunk_tensor(memory_obj, end - start)
        skip = min(end - start, max(0, int(kwargs.get("vllm_cached_tokens", 0)) - start))
        if skip == end - start:
            return
        k_rows, v_rows = self._row_indices(kwargs, start + skip, end)
        n = (end - start - skip) * self.num_heads
        for layer, rows in enumerate(self._layers):
            rows.rows.index_copy_(0, k_rows, src[0, layer, skip:].reshape(n, self.head_size))
            rows.rows.index_copy_(0, v_rows, src[1, layer, skip:].reshape(n, self.head_size))

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

    def _bind(self, kvcaches: Sequence[torch.Tensor]) -> None:
        """Row views of vLLM's caches, made once (vLLM allocates them once, at start-up)."""
        if self.kvcaches is not None and len(kvcaches) == len(self._layers) and all(
                a is b.source for a, b in zip(kvcaches, self._layers)):
            return
        if len(kvcaches) != self.num_layers:
            raise KVLayoutError(f"vLLM handed {len(kvcaches)} KV cache layers, LMCache's metadata "
                                f"says {self.num_layers}")
        layers = [_LayerRows(t, self.num_heads, self.head_size, self.dtype, i)
                  for i, t in enumerate(kvcaches)]
        sizes = {t.shape[2] for t in kvcaches}
        strides = {(r.block_stride, r.head_stride) for r in layers}
        if len(sizes) != 1 or len(strides) != 1:
            raise KVLayoutError(f"vLLM's KV cache layers differ in block size {sorted(sizes)} or "
                                f"strides {sorted(strides)}")
        self._layers, self._block_size, self.kvcaches = layers, sizes.pop(), list(kvcaches)

    def _row_indices(self, kwargs: dict, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row numbers of tokens ``start:end``'s K and V, token-major then head, as LMCache's
        ``[tokens, heads*head_size]`` rows run."""
        if "kvcaches" in kwargs:
            self._bind(kwargs["kvcaches"])
        if self.kvcaches is None:
            raise KVLayoutError("LMCache passed no 'kvcaches' to the CPU KV connector")
        if "slot_mapping" not in kwargs:
            raise KVLayoutError("LMCache passed no 'slot_mapping' to the CPU KV connector")
        slots = kwargs["slot_mapping"][start:end].to(torch.int64)
        if slots.numel() != end - start or bool((slots < 0).any()):
            raise KVLayoutError(f"slot_mapping[{start}:{end}] does not map every token to a slot")
        first = self._layers[0]
        bs = self._block_size
        blocks = torch.div(slots, bs, rounding_mode="floor")
        base = blocks * first.block_stride + (slots - blocks * bs)
        heads = torch.arange(self.num_heads, dtype=torch.int64) * first.head_stride
        k_rows = (base[:, None] + heads[None, :]).reshape(-1)
        return k_rows, k_rows + bs
