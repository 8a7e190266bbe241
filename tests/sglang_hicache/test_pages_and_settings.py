"""The SGLang backend's page math and settings, without SGLang: contiguous runs of strided
views (a page of a host pool) and the extra-config keys."""

from __future__ import annotations

import pytest
import torch

from lmcache_valkey.errors import ConfigError
from lmcache_valkey.integrations.sglang.pages import contiguous_runs, page_starts
from lmcache_valkey.integrations.sglang.settings import parse_backend_settings


def runs_of(view: torch.Tensor) -> list[tuple[int, int]]:
    return contiguous_runs(view.shape, view.stride(), view.element_size())


def gathered(view: torch.Tensor, base: torch.Tensor) -> bytes:
    """The bytes the runs name, read from the base buffer, in order."""
    raw = base.view(torch.uint8).reshape(-1).numpy().tobytes()
    start = view.data_ptr() - base.data_ptr()
    return b"".join(raw[start + off:start + off + n] for off, n in runs_of(view))


@pytest.mark.parametrize("dims, page", [
    # MHA layer_first (2, L, size, H, D): a page is [:, :, i:i+ps] -> one run per (kv, layer)
    ((2, 3, 64, 2, 8), lambda b: b[:, :, 8:12]),
    # MHA page_first (2, size, L, H, D): [:, i:i+ps] -> one run per kv
    ((2, 64, 3, 2, 8), lambda b: b[:, 8:12]),
    # MHA page_first_direct (2, pages, L, ps, H, D): [:, p:p+1] -> one run per kv
    ((2, 16, 3, 4, 2, 8), lambda b: b[:, 2:3]),
    # MLA layer_first (L, size, 1, D)
    ((3, 64, 1, 40), lambda b: b[:, 8:12]),
    # MLA page_first_direct (pages, L, ps, 1, D): one run
    ((16, 3, 4, 1, 40), lambda b: b[2:3]),
])
def test_runs_cover_a_page_in_its_flat_order(dims, page) -> None:
    base = torch.randn(dims, dtype=torch.float32).to(torch.bfloat16)
    view = page(base)
    want = view.contiguous().view(torch.uint8).numpy().tobytes()
    assert gathered(view, base) == want
    assert sum(n for _, n in runs_of(view)) == len(want)


def test_run_counts_per_layout() -> None:
    lf = torch.zeros((2, 3, 64, 2, 8))
    assert len(runs_of(lf[:, :, 8:12])) == 6  # kv x layers
    assert len(runs_of(torch.zeros((2, 64, 3, 2, 8))[:, 8:12])) == 2
    assert len(runs_of(torch.zeros((2, 64, 3, 2, 8))[:, 8:9])) == 2
    assert runs_of(torch.zeros((4, 5))) == [(0, 80)]  # dense: one run


def test_page_starts_accepts_whole_pages_only() -> None:
    assert page_starts(torch.arange(8, 16), 2, 4) == [8, 12]
    assert page_starts(torch.tensor([8, 9, 10, 11, 0, 1, 2, 3]), 2, 4) == [8, 0]
    assert page_starts(torch.arange(8, 15), 2, 4) is None
    assert page_starts(torch.tensor([8, 9, 10, 20, 0, 1, 2, 3]), 2, 4) is None


def test_settings_name_a_bad_key_as_sglang_users_write_it() -> None:
    with pytest.raises(ConfigError) as e:
        parse_backend_settings({"backend_name": "valkey", "interface_v1": 1, "lookup_timeout": 1})
    assert e.value.key == "hicache_storage_backend_extra_config.lookup_timeout"
    with pytest.raises(ConfigError) as e:
        parse_backend_settings(["url"])
    assert e.value.key == "hicache_storage_backend_extra_config"
    s = parse_backend_settings({"url": "valkey://h:1", "skip_existing": "false", "interface_v1": 1})
    assert s.interface_v1 and not s.skip_existing and s.store.nodes[0].port == 1
