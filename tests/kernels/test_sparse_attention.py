"""The DSA short-chunk paths equal mlx-lm's stock attention (engine/kernels/sparse_attention.py).

Float32, on the tiny glm_moe_dsa model's own attention layer: the same chunk
on copies of the same cache through the stock ``__call__`` and through the
installed one, relative L2 <= 1e-5, for chunk lengths on both sides of each
threshold, contexts below and above ``index_topk``, batch 1 and batch 3 with
left padding (mlx-lm's BatchKVCache merge, its mask).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import CacheList, KVCache

from engine.kernels import sparse_attention as sa
from engine.runtime.model.tiny_models import build_model

CHUNKS = (2, 16, 64, 128, 129, 256, 512, 513)
TOL = 1e-5


@pytest.fixture(scope="module")
def attn():
    model = build_model("glm_moe_dsa")
    layer = model.model.layers[0].self_attn
    sa.install(model, sa.SparseRouting())
    yield layer
    sa.uninstall(model)


def _prefilled(attn, length: int, seed: int) -> CacheList:
    """A DSA layer cache holding `length` tokens of random hidden states (stock path)."""
    cache = CacheList(KVCache(), KVCache())
    mx.random.seed(seed)
    x = mx.random.normal((1, length, attn.hidden_size))
    for s in range(0, length, 256):
        part = x[:, s : s + 256]
        attn._stock_call(part, create_attention_mask(part, cache[0], return_array=True), cache)
    mx.eval([c.state for c in cache.caches])
    return cache


def _copy(cache: CacheList) -> CacheList:
    out = CacheList(KVCache(), KVCache())
    for mine, theirs in zip(out.caches, cache.caches):
        mine.keys, mine.values = mx.array(theirs.keys), mx.array(theirs.values)
        mine.offset = theirs.offset
    return out


def _batch(caches: list) -> CacheList:
    """mlx-lm's merge of single-sequence caches: a BatchKVCache pair with left padding."""
    return CacheList.merge([_copy(c) for c in caches])


def _run(call, x, cache):
    out = call(x, create_attention_mask(x, cache[0], return_array=True), cache)
    mx.eval(out, [c.state for c in cache.caches])
    return out


def _rel(a: mx.array, b: mx.array) -> float:
    return (mx.linalg.norm((a - b).flatten()) / mx.linalg.norm(b.flatten())).item()


def _compare(attn, prefixes: list[int], chunk: int, topk: int):
    """(relative L2 of ours vs stock, paths routed) for one chunk after `prefixes` tokens."""
    attn.indexer.index_topk = topk
    try:
        caches = [_prefilled(attn, n, seed=n) for n in prefixes]
        mx.random.seed(1000 + chunk)
        x = mx.random.normal((len(prefixes), chunk, attn.hidden_size))
        stock_cache, ours_cache = _batch(caches), _batch(caches)
        if len(prefixes) == 1:
            stock_cache, ours_cache = _copy(caches[0]), _copy(caches[0])
        before = dict(sa.ROUTED)
        stock = _run(attn._stock_call, x, stock_cache)
        ours = _run(attn, x, ours_cache)
        routed = {k: v - before.get(k, 0) for k, v in sa.ROUTED.items() if v != before.get(k, 0)}
        # Both paths append the same rows to the latent and indexer caches.
        for s, o in zip(stock_cache.caches, ours_cache.caches):
            assert mx.array_equal(s.keys, o.keys) and mx.array_equal(s.values, o.values)
        return _rel(ours, stock), routed
    finally:
        attn.indexer.index_topk = 8


def _expected(chunk: int) -> str:
    return "decode" if chunk <= 128 else "gather" if chunk <= 512 else "stock"


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("prefixes", [[31], [40, 7, 23]], ids=["batch1", "batch3-left-padded"])
def test_above_topk_equals_stock(attn, chunk, prefixes):
    """index_topk 32: the early queries of a short row see fewer keys than that,
    so their top-k holds masked (causal or padding) positions the mask must drop."""
    rel, routed = _compare(attn, prefixes, chunk, topk=32)
    assert rel <= TOL, (chunk, rel)
    path = _expected(chunk)
    # The union of a long chunk's blocks is too wide to pay on random weights:
    # block-gather hands it to the decode shape (test_block_gather_* forces it).
    assert set(routed) == ({"decode"} if path == "gather" else {path}), routed


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("prefixes", [[40], [40, 7, 23]], ids=["batch1", "batch3-left-padded"])
def test_below_topk_is_stock(attn, chunk, prefixes):
    """Context no longer than index_topk: the indexer selects nothing; mlx-lm's path runs."""
    rel, routed = _compare(attn, prefixes, chunk, topk=2048)
    assert rel == 0.0 and set(routed) == {"stock"}, (rel, routed)


@pytest.mark.parametrize("chunk", (129, 256, 512))
@pytest.mark.parametrize("prefixes", [[300], [300, 150, 260]], ids=["batch1", "batch3-left-padded"])
@pytest.mark.parametrize("near", [False, True], ids=["topk8", "topk-context-1"])
def test_block_gather_equals_stock(attn, monkeypatch, chunk, prefixes, near):
    """Block-gather forced, with blocks of 3 so the union leaves some out (topk 8),
    and with nearly every position selected, the partial last block included."""
    plan = attn._sparse_routing
    attn._sparse_routing = sa.SparseRouting(block=3)
    monkeypatch.setattr(sa, "gather_pays", lambda *a: True)
    try:
        topk = max(prefixes) + chunk - 1 if near else 8
        rel, routed = _compare(attn, prefixes, chunk, topk=topk)
    finally:
        attn._sparse_routing = plan
    assert rel <= TOL, (chunk, rel)
    assert routed == {"gather": 1}


def test_block_union_is_partial_with_small_blocks():
    """The forced block-gather cases above really leave blocks out (else it is stock's set)."""
    topk = mx.array([[[[0, 1, 9], [2, 9, 30]]]])  # (B=1, 1, L=2, K=3)
    blocks = sa.selected_blocks(topk, context=40, block=4)
    assert blocks.tolist() == [[0, 2, 7]]


def test_one_token_and_long_chunks_are_untouched(attn):
    """L == 1 and L > gather_max call mlx-lm's own __call__: bit-identical."""
    for chunk in (1, 600):
        rel, routed = _compare(attn, [40], chunk, topk=8)
        assert rel == 0.0 and set(routed) == {"stock"}, (chunk, rel, routed)


def test_install_swaps_the_class_and_uninstall_restores_it():
    model = build_model("glm_moe_dsa")
    before = dict(nn.utils.tree_flatten(model.parameters()))
    assert sa.install(model, sa.SparseRouting()) == 2
    layer = model.model.layers[1].self_attn
    assert type(layer).__name__ == "SparseDeepseekV32Attention"
    after = dict(nn.utils.tree_flatten(model.parameters()))
    assert after.keys() == before.keys()  # the parameter tree is unchanged
    sa.uninstall(model)
    assert type(layer).__name__ == "DeepseekV32Attention"


def test_no_dsa_layers_installs_nothing():
    assert sa.install(build_model("llama"), sa.SparseRouting()) == 0


@pytest.mark.parametrize("decode_max, gather_max, block", [(0, 512, 64), (256, 128, 64), (1, 2, 0)])
def test_bad_thresholds_are_refused(decode_max, gather_max, block):
    with pytest.raises(ValueError, match="sparse"):
        sa.SparseRouting(decode_max, gather_max, block)


def test_decode_shape_in_one_query_pieces_equals_stock(attn, monkeypatch):
    """Pieces of one query each, spread over the CPU streams, give the same output."""
    monkeypatch.setattr(sa, "GATHER_BYTES", 1)
    rel, routed = _compare(attn, [40, 7, 23], 16, topk=32)
    assert rel <= TOL and routed == {"decode": 1}, (rel, routed)
