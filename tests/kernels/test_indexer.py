"""The kernels' DSA indexer equals mlx-lm's bit for bit (engine/kernels/indexer.py),
and the CPU streams it and the decode shape use are each thread's own
(engine/kernels/cpu_streams.py)."""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import CacheList

from engine.kernels import cpu_streams, indexer, sparse_attention
from engine.runtime.model.tiny_models import build_model
from tests.kernels.test_sparse_attention import _copy, _prefilled


@pytest.fixture(scope="module")
def attn():
    model = build_model("glm_moe_dsa")
    sparse_attention.install(model, sparse_attention.SparseRouting())  # _prefilled's stock call
    yield model.model.layers[0].self_attn
    sparse_attention.uninstall(model)


def _both(attn, prefixes, chunk, topk=32):
    """mlx-lm's top-k and ours for one chunk after `prefixes` tokens, and their caches."""
    attn.indexer.index_topk = topk
    try:
        caches = [_prefilled(attn, n, seed=n) for n in prefixes]
        if len(prefixes) == 1:
            theirs, ours = _copy(caches[0]), _copy(caches[0])
        else:
            theirs = CacheList.merge([_copy(c) for c in caches])
            ours = CacheList.merge([_copy(c) for c in caches])
        mx.random.seed(7 + chunk)
        x = mx.random.normal((len(prefixes), chunk, attn.hidden_size))
        mask = create_attention_mask(x, theirs[0], return_array=True)
        qr = attn.q_a_layernorm(attn.q_a_proj(x))
        a = attn.indexer(x, qr, mask, cache=theirs[1])
        b = indexer.topk(attn.indexer, x, qr, mask, ours[1])
        mx.eval(a, b, theirs[1].keys, ours[1].keys)
        return a, b, theirs[1], ours[1]
    finally:
        attn.indexer.index_topk = 8


@pytest.mark.parametrize("chunk", (2, 3, 64, 129, 512))
@pytest.mark.parametrize("prefixes", [[31], [40, 7, 23]], ids=["batch1", "batch3-left-padded"])
def test_topk_equals_mlx_lm_bit_for_bit(attn, chunk, prefixes):
    a, b, theirs, ours = _both(attn, prefixes, chunk)
    assert a.shape == b.shape and mx.array_equal(a, b), chunk
    assert mx.array_equal(theirs.keys, ours.keys) and mx.array_equal(theirs.values, ours.values)


def test_each_thread_gets_its_own_streams():
    mine = cpu_streams.streams()
    assert cpu_streams.streams() is mine  # made once per thread
    seen = {}

    def other():
        seen["streams"] = cpu_streams.streams()
        with cpu_streams.on(seen["streams"][-1]):
            seen["sum"] = (mx.arange(4) + 1).sum().item()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["sum"] == 10
    assert all(s is None or s not in mine for s in seen["streams"])


def test_topk_in_another_thread_equals_mlx_lm(attn):
    """The model loop runs in its own thread: the streams work there too."""
    result = {}
    t = threading.Thread(target=lambda: result.update(out=_both(attn, [40, 7, 23], 64)))
    t.start()
    t.join()
    a, b, _, _ = result["out"]
    assert mx.array_equal(a, b)
