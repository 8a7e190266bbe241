"""Checksums prove a chunk was not damaged, not that its metadata is true.

Whoever can write a tenant's keys can store a value whose CRCs and digests are all valid
but whose payload is empty or cut short, or whose header claims another dtype and shape.
Through LMCache's own storage stack: such a chunk is never served, the miss is counted as
``meta``, and the value is deleted, so lookups stop reporting it.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from conftest_helpers import SMALL, filled, miss_count, payload, put_and_wait
from support.chunks import cut_short, rewrite


def empty(meta, body):
    return meta, b""


def float32_half_hidden(meta, body):
    """Same bytes, described consistently as float32 with half the hidden size."""
    (shape,) = meta.shapes
    assert 4 * shape[0] * shape[1] * shape[2] * (shape[3] // 2) == len(body)
    return dataclasses.replace(meta, shapes=(shape[:-1] + (shape[-1] // 2,),), dtypes=("torch.float32",)), body


def another_format(meta, body):
    return dataclasses.replace(meta, fmt=meta.fmt + 1), body


def half_the_layers(meta, body):
    """Reads like a partial chunk of half the tokens; it is not one."""
    (shape,) = meta.shapes
    return dataclasses.replace(meta, shapes=((shape[0], shape[1] // 2, shape[2], shape[3]),)), body[: len(body) // 2]


@pytest.mark.parametrize("change", [empty, cut_short, float32_half_hidden, another_format, half_the_layers])
def test_a_chunk_whose_valid_checksums_cover_lying_metadata_is_a_counted_miss_and_deleted(
        valkey_server, make_stack, change):
    stack = make_stack({"url": valkey_server.url})
    assert stack.connector is not None
    objs = [filled(stack, i) for i in (1, 2)]
    good = payload(objs[1])
    put_and_wait(stack, [SMALL.key(1), SMALL.key(2)], objs)
    for o in objs:
        o.ref_count_down()
    ns = stack.connector.namespace
    key = ns.data_key(ns.chunk_id(SMALL.key(1).to_string()))
    rewrite(valkey_server, key, change)
    assert stack.remote.batched_contains([SMALL.key(1), SMALL.key(2)]) == 2  # a lookup cannot tell

    before = miss_count("meta")
    assert stack.remote.get_blocking(SMALL.key(1)) is None
    assert miss_count("meta") == before + 1
    deadline = time.monotonic() + 5
    while valkey_server.cmd("EXISTS", key) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert valkey_server.cmd("EXISTS", key) == 0, "a chunk that can never be served must be deleted"
    assert stack.remote.batched_contains([SMALL.key(1)]) == 0  # lookups stop reporting it

    other = stack.remote.get_blocking(SMALL.key(2))  # its neighbour is untouched
    assert other is not None and payload(other) == good
    other.ref_count_down()
