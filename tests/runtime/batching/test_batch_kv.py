"""LineageBatchKVCache: the mask mlx-lm builds for a decode step is skipped only where
every row is unpadded, and a decode without it gives the tokens a masked one gives."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from engine.runtime.batching.batch import LineageBatchKVCache, merge_with_room


def _kv(n: int) -> KVCache:
    c = KVCache()
    if n:
        c.update_and_fetch(mx.ones((1, 2, n, 4)), mx.ones((1, 2, n, 4)))
    return c


def _merged(*lengths: int) -> LineageBatchKVCache:
    (cache,) = merge_with_room([[_kv(n)] for n in lengths], room=8)
    assert isinstance(cache, LineageBatchKVCache)
    return cache


@pytest.mark.parametrize(
    "lengths, unmasked",
    [((5,), True), ((5, 5), True), ((5, 3), False), ((0, 0), True)],
)
def test_a_decode_step_is_unmasked_only_where_no_row_is_padded(lengths, unmasked):
    cache = _merged(*lengths)
    assert (cache.make_mask(1) is None) == unmasked
    assert cache.make_mask(2) is not None  # a chunk keeps mlx-lm's mask
    assert cache.make_mask(1, return_array=True) is not None


def test_filter_and_extend_keep_the_padding_known():
    cache = _merged(5, 3, 1)
    cache.filter([0, 1])  # rows of 5 and 3 tokens: still padded
    assert cache.make_mask(1) is not None
    cache.filter([1])  # one row left: mlx-lm shifts its padding away
    assert cache.make_mask(1) is None
    cache.extend(_merged(7))  # rows of unequal length: the shorter is padded
    assert cache.make_mask(1) is not None
    same = _merged(4)
    same.extend(_merged(4))
    assert same.make_mask(1) is None


def test_an_unmasked_decode_step_attends_as_the_masked_one():
    """The same attention output without the all-true mask mlx-lm would build."""
    from mlx_lm.models.base import scaled_dot_product_attention

    cache = _merged(6, 6)
    mask = super(LineageBatchKVCache, cache).make_mask(1)  # mlx-lm's, before the update
    assert cache.make_mask(1) is None
    q = mx.random.normal((2, 2, 1, 4))
    keys, values = cache.update_and_fetch(
        mx.random.normal((2, 2, 1, 4)), mx.random.normal((2, 2, 1, 4))
    )
    masked = scaled_dot_product_attention(q, keys, values, cache=cache, scale=0.5, mask=mask)
    plain = scaled_dot_product_attention(q, keys, values, cache=cache, scale=0.5, mask=None)
    assert mx.allclose(masked, plain).item()
