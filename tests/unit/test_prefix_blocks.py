"""The block counts of a prefix lookup (transport/resp/prefix.py): the request is the EXISTS
commands a generic encoder writes, and the counts settle where the prefix ends."""

from __future__ import annotations

import pytest

from lmcache_valkey.errors import ProtocolError, ServerError
from lmcache_valkey.transport.resp.parser import encode_command
from lmcache_valkey.transport.resp.prefix import BLOCK, block_counts_request, leading, settle, with_block


@pytest.mark.parametrize("n", [32, 33, 40, 47, 100, 512])
@pytest.mark.parametrize("same_length", [True, False])
def test_the_request_is_one_exists_per_block_of_keys(n: int, same_length: bool) -> None:
    keys = [b"lmcv:t:ns:{%032x}" % i for i in range(n)]
    if not same_length:
        keys[-1] = b"x"
    data, sizes = block_counts_request(keys)
    assert data == b"".join(encode_command((b"EXISTS", *keys[a:a + BLOCK])) for a in range(0, n, BLOCK))
    assert sizes == [min(BLOCK, n - a) for a in range(0, n, BLOCK)]


SIZES = [16, 16, 16, 4]


@pytest.mark.parametrize("counts, step", [
    ([16, 16, 16, 4], (52, 52)),   # all there
    ([0, 0, 0, 0], (0, 0)),        # none
    ([16, 0, 16, 4], (16, 16)),    # the second block empty: the prefix ends where it starts
    ([16, 9, 0, 0], (16, 32)),     # the second block partly there: ask its keys
    ([16, 16, 16, 3], (48, 52)),   # the short last block partly there
    ([3, 16, 16, 4], (0, 16)),     # a hole in the first block
])
def test_the_first_block_not_full_is_where_the_prefix_ends(counts, step) -> None:
    assert settle(counts, SIZES) == step


def test_an_error_before_the_prefix_ends_asks_per_key_one_after_it_is_ignored() -> None:
    assert settle([16, ServerError("READONLY no"), 16, 4], SIZES) is None
    assert settle([16, 2, ServerError("READONLY no"), 4], SIZES) == (16, 32)


@pytest.mark.parametrize("bad", [17, -1, True, b"16", None, [16]])
def test_a_count_that_cannot_be_is_a_protocol_error(bad) -> None:
    with pytest.raises(ProtocolError):
        settle([16, bad, 16, 4], SIZES)


def test_a_reply_count_that_does_not_match_the_blocks_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        settle([16, 16, 16], SIZES)
    with pytest.raises(ProtocolError):
        settle(16, SIZES)


def test_the_answer_is_the_prefix_then_absent() -> None:
    assert leading(2, 4) == [True, True, False, False]


def test_a_block_asked_per_key_keeps_its_answers_between_the_prefix_and_the_rest() -> None:
    assert with_block(2, [True, False, True], 7) == [True, True, True, False, True, False, False]
