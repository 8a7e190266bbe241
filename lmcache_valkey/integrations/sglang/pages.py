"""Where one page of SGLang's host KV pool lies in memory, as the parts the store moves in place.

A stored page is the bytes of SGLang's own ``get_data_page(index, flat=True)``: the plain
API (``batch_get``/``batch_set``) and the zero-copy API (``batch_get_v1``/``batch_set_v1``)
therefore store the same bytes and read each other's pages. The zero-copy API never builds
that flat copy: the page's view ``get_data_page(index, flat=False)`` is a strided slice of the
pool's buffer, and :func:`contiguous_runs` turns its strides into the contiguous runs, in
order, that the store sends from and reads into (one run per K/V for ``page_first`` and
``page_first_direct``, one per layer and K/V for ``layer_first``).

Which bytes mean what is the page's *order*: its dimensions by name, in storage order, those
of extent 1 dropped (:data:`PAGE_DIMS`). Two layouts with the same order store the same bytes
and share pages (``layer_first`` and ``page_first_direct``: layer, then token; ``page_first``
with one token per page too); different orders never meet: the order is part of the namespace
and of each chunk's header.

Never imports: ``sglang`` (the pool is read by attribute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

# The dimensions of ``get_data_page(index, flat=False)`` per host pool class and layout.
PAGE_DIMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("MHATokenToKVPoolHost", "layer_first"): ("kv", "layer", "token", "head", "dim"),
    ("MHATokenToKVPoolHost", "page_first"): ("kv", "token", "layer", "head", "dim"),
    ("MHATokenToKVPoolHost", "page_first_direct"): ("kv", "page", "layer", "token", "head", "dim"),
    ("MLATokenToKVPoolHost", "layer_first"): ("layer", "token", "head", "dim"),
    ("MLATokenToKVPoolHost", "page_first"): ("token", "layer", "head", "dim"),
    ("MLATokenToKVPoolHost", "page_first_direct"): ("page", "layer", "token", "head", "dim"),
}
LAYOUTS = ("layer_first", "page_first", "page_first_direct")


class UnsupportedPool(ValueError):
    """A host pool whose pages this backend cannot address (its class or layout)."""


def contiguous_runs(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> list[tuple[int, int]]:
    """The contiguous byte runs of a strided view, in the view's (C) order: ``(offset from
    the view's first element, length)``. Adjacent runs are merged."""
    dims = [(n, s * itemsize) for n, s in zip(shape, strides) if n != 1]
    if any(n == 0 for n in shape):
        return []
    block = itemsize
    while dims and dims[-1][1] == block:  # the innermost dims that are dense form one block
        block *= dims.pop()[0]
    runs: list[tuple[int, int]] = []
    for index in _indices([n for n, _ in dims]):
        offset = sum(i * s for i, (_, s) in zip(index, dims))
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + block)
        else:
            runs.append((offset, block))
    return runs


def _indices(extents: Sequence[int]) -> Iterator[tuple[int, ...]]:
    if not extents:
        yield ()
        return
    for head in range(extents[0]):
        for rest in _indices(extents[1:]):
            yield (head, *rest)


@dataclass(frozen=True)
class PageFormat:
    """What one page's bytes are: named dims (extent 1 dropped), dtype, size."""

    dims: tuple[tuple[str, int], ...]
    dtype: str
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.dims)

    def fields(self) -> dict[str, Any]:
        return {"page": [list(d) for d in self.dims], "dtype": self.dtype}


class PoolPages:
    """The parts of each page of one host pool, as slices of one byte view of its buffer.

    ``pool`` is SGLang's host pool (``kv_buffer``, ``page_size``, ``size``, ``layout``,
    ``dtype``, ``get_data_page``). Built once, at ``register_mem_pool_host``.
    """

    def __init__(self, pool: Any) -> None:
        kind = type(pool).__name__
        layout = getattr(pool, "layout", None)
        names = PAGE_DIMS.get((kind, layout))
        if names is None:
            raise UnsupportedPool(
                f"host pool {kind} with layout {layout!r}: the lmcache-valkey backend supports "
                f"MHATokenToKVPoolHost and MLATokenToKVPoolHost with --hicache-mem-layout "
                + "|".join(LAYOUTS))
        buf = pool.kv_buffer
        if buf is None or not buf.is_contiguous() or buf.device.type != "cpu":
            raise UnsupportedPool(f"host pool {kind}: its kv_buffer is not one contiguous CPU tensor")
        self.pool = pool
        self.page_size = int(pool.page_size)
        self.capacity = int(pool.size)  # tokens
        self.itemsize = int(buf.element_size())
        # One byte view of the whole buffer: every part is a slice of it (no copy, and the
        # same memory the fabric transport registers once).
        self.arena: memoryview = memoryview(buf.reshape(-1).view(torch.uint8).numpy())
        self.base = int(buf.data_ptr())
        first = pool.get_data_page(0, flat=False)
        if len(first.shape) != len(names):
            raise UnsupportedPool(f"host pool {kind} ({layout}): a page view of shape {tuple(first.shape)}, "
                                  f"expected dims {names}")
        self.format = PageFormat(
            dims=tuple((name, int(n)) for name, n in zip(names, first.shape) if n != 1),
            dtype=str(pool.dtype).removeprefix("torch."),
            nbytes=math.prod(int(n) for n in first.shape) * self.itemsize,
        )
        self.runs = tuple(contiguous_runs(first.shape, first.stride(), self.itemsize))
        start0 = self._start(first)
        # Where page p starts is linear in p for every supported layout; checked here once,
        # so that each transfer computes offsets instead of slicing tensors.
        pages = self.capacity // self.page_size
        self._page_stride: int | None = None
        if pages > 1:
            stride = self._start(pool.get_data_page(self.page_size, flat=False)) - start0
            probes = {pages - 1, pages // 2}
            if all(self._start(pool.get_data_page(p * self.page_size, flat=False)) - start0 == p * stride
                   for p in probes):
                self._page_stride = stride
        self._start0 = start0
        self._view_of: Callable[[int], Any] = lambda index: pool.get_data_page(index, flat=False)
        if sum(n for _, n in self.runs) != self.format.nbytes:
            raise UnsupportedPool(f"host pool {kind} ({layout}): page runs cover {sum(n for _, n in self.runs)} "
                                  f"bytes, the page holds {self.format.nbytes}")

    def _start(self, view: Any) -> int:
        return int(view.data_ptr()) - self.base

    def valid_start(self, index: int) -> bool:
        return index % self.page_size == 0 and 0 <= index and index + self.page_size <= self.capacity

    def parts(self, index: int) -> list[memoryview]:
        """The page that starts at token slot ``index``: its runs, in order, as slices of the arena."""
        if self._page_stride is not None:
            start = self._start0 + (index // self.page_size) * self._page_stride
        else:
            start = self._start(self._view_of(index))
        a = self.arena
        return [a[start + off:start + off + n] for off, n in self.runs]

    @property
    def region(self) -> tuple[int, int]:
        """(address, length) of the pool's buffer, for registering it with the fabric once."""
        return self.base, self.arena.nbytes


def page_starts(host_indices: Any, n_pages: int, page_size: int) -> list[int] | None:
    """The first token slot of each page, or None when ``host_indices`` does not hold exactly
    ``n_pages`` pages of ``page_size`` consecutive slots."""
    idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
    if len(idx) != n_pages * page_size:
        return None
    starts = idx[::page_size]
    # SGLang allocates host memory in whole pages: a page's slots run from its first on.
    if any(idx[p * page_size + page_size - 1] - s != page_size - 1 for p, s in enumerate(starts)):
        return None
    return starts
