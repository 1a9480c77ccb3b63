"""The host-BLAS dense attention equals MLX's (engine/kernels/dense_attention.py).

Against ``mx.fast.scaled_dot_product_attention`` for every mask the model loop
passes (none, "causal" chunks, BatchKVCache's left-padded boolean masks in
prefill and decode, additive and per-head masks), with GQA and different key
and value widths; the dispatcher's threshold and fallbacks; install and
uninstall on real tiny models, whose forwards through batch caches match the
stock ones; the host BLAS held to one thread while installed.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base as mlx_base
from mlx_lm.models import deepseek_v32, llama, qwen3_next
from mlx_lm.models.base import create_causal_mask
from threadpoolctl import threadpool_info

from engine.kernels import dense_attention as da
from engine.runtime.batching.batch import merge_with_room
from engine.runtime.model.tiny_models import build_model

TOL = 2e-5


def _qkv(B, H, Hkv, L, T, D=16, Dv=16, seed=0):
    mx.random.seed(seed)
    return (
        mx.random.normal((B, H, L, D)),
        mx.random.normal((B, Hkv, T, D)),
        mx.random.normal((B, Hkv, T, Dv)),
    )


def _masks(B, H, L, T):
    """name -> mask, for queries that are the last L of T positions."""
    pads = mx.array([0, 3, T - L + 1][:B])  # the last row's first query sees nothing
    return {
        "none": None,
        "causal": "causal",
        "causal-array": create_causal_mask(L, T - L)[None, None],
        "left-padded": create_causal_mask(L, T - L, left_padding=pads),
        "additive": mx.random.normal((1, H, L, T)),
        "per-head-bool": mx.random.uniform(shape=(B, H, L, T)) > 0.2,
        "keys-only": mx.arange(T) >= 5,  # (T,): one row broadcast everywhere
    }


@pytest.mark.parametrize("mask_name", list(_masks(1, 4, 1, 8)))
@pytest.mark.parametrize(
    "B, H, Hkv, L, T, Dv",
    [
        (1, 4, 2, 1, 1500, 16),  # decode, GQA
        (1, 4, 2, 16, 1500, 16),  # a prefill chunk, GQA
        (3, 4, 2, 1, 1200, 16),  # a decode batch
        (3, 4, 2, 6, 1200, 16),  # a batch prefill chunk
        (1, 4, 4, 5, 1100, 8),  # no grouping, value width 8
    ],
)
def test_host_attention_equals_mlx(B, H, Hkv, L, T, Dv, mask_name):
    q, k, v = _qkv(B, H, Hkv, L, T, Dv=Dv)
    mask = _masks(B, H, L, T)[mask_name]
    stock = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    ours = da.host_attention(q, k, v, 0.25, mask)
    assert ours.shape == stock.shape and ours.dtype == stock.dtype
    assert mx.abs(ours - stock).max().item() <= TOL


def test_sliced_cache_views_give_the_same_attention():
    """Keys sliced out of a longer buffer (what a KV cache returns) attend as stock's."""
    q, k, v = _qkv(1, 4, 2, 3, 2048)
    ks, vs = k[:, :, :1500], v[:, :, :1500]
    stock = mx.fast.scaled_dot_product_attention(q, ks, vs, scale=0.3, mask="causal")
    assert mx.abs(da.host_attention(q, ks, vs, 0.3, "causal") - stock).max().item() <= TOL


class _Quantized:
    bits = 8
    group_size = 64


def test_dispatch_takes_the_host_path_only_where_it_applies():
    sdpa = da.dispatcher(min_keys=1024)
    q, k, v = _qkv(1, 4, 2, 2, 1024)
    before = dict(da.ROUTED)
    sdpa(q, k, v, None, 0.25, "causal")
    assert da.ROUTED["host"] == before.get("host", 0) + 1
    host = da.ROUTED["host"]
    sdpa(q, k[:, :, :1023], v[:, :, :1023], None, 0.25, "causal")  # under the threshold
    qb, kb, vb = (a.astype(mx.bfloat16) for a in (q, k, v))
    out = sdpa(qb, kb, vb, None, 0.25, "causal")  # no BLAS for bfloat16
    assert out.dtype == mx.bfloat16
    sinks = mx.zeros((4,))
    stock = mlx_base.scaled_dot_product_attention(q, k, v, None, 0.25, "causal", sinks=sinks)
    assert mx.array_equal(sdpa(q, k, v, None, 0.25, "causal", sinks=sinks), stock)
    # A quantized cache's keys and values go to mlx-lm's quantized path.
    q, k, v = _qkv(1, 4, 2, 2, 1024, D=64, Dv=64)
    qk, qv = mx.quantize(k, group_size=64, bits=8), mx.quantize(v, group_size=64, bits=8)
    # (mlx-lm's quantized path scales the queries in place: each call gets its own)
    stock = mlx_base.scaled_dot_product_attention(q * 1, qk, qv, _Quantized(), 0.25, "causal")
    assert mx.array_equal(sdpa(q * 1, qk, qv, _Quantized(), 0.25, "causal"), stock)
    assert da.ROUTED["host"] == host


def test_a_chunk_of_queries_takes_the_host_path_from_its_own_threshold():
    sdpa = da.dispatcher(min_keys=1024, chunk_min_keys=128)
    before = da.ROUTED["host"]
    q, k, v = _qkv(1, 4, 2, da.CHUNK_ROWS, 200)  # a prefill chunk at 200 keys
    out = sdpa(q, k, v, None, 0.25, "causal")
    assert da.ROUTED["host"] == before + 1
    stock = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    assert mx.abs(out - stock).max().item() <= TOL
    sdpa(q[:, :, :1], k, v, None, 0.25, "causal")  # one query (decode) at 200 keys
    sdpa(q[:, :, : da.CHUNK_ROWS - 1], k, v, None, 0.25, "causal")  # a verify's few
    sdpa(q, k[:, :, :127], v[:, :, :127], None, 0.25, "causal")  # a chunk under 128 keys
    assert da.ROUTED["host"] == before + 1
    assert da.dispatcher(1024, None).chunk_min_keys == 1024  # None: the one threshold
    assert da.dispatcher(64, 128).chunk_min_keys == 64  # never above min_keys


def _batch_cache(model, prompts):
    """A merged (BatchKVCache) cache of the prompts, as the model loop builds it."""
    caches = []
    for p in prompts:
        c = model.make_cache()
        model(mx.array([p]), cache=c)
        caches.append(c)
    return merge_with_room(caches, room=64)


@pytest.mark.parametrize("arch", ["qwen3_next", "llama"])
def test_installed_forward_through_batch_caches_matches_stock(arch):
    model = build_model(arch)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(20, 400, n).tolist() for n in (1100, 1040)]
    chunk = mx.array(rng.integers(20, 400, (2, 8)).tolist())
    decode = mx.array([[7], [9]])

    def run():
        cache = _batch_cache(model, prompts)  # left-padded: 60 rows for the shorter
        outs, routed = [], []
        for tokens in (chunk, decode):  # a batch prefill chunk, then a decode step
            host = da.ROUTED["host"]
            outs.append(model(tokens, cache=cache))
            mx.eval(outs[-1])
            routed.append(da.ROUTED["host"] - host)
        return outs, routed

    stock, _ = run()
    assert da.install(model, min_keys=1024)
    try:
        module = qwen3_next if arch == "qwen3_next" else llama
        assert module.scaled_dot_product_attention.min_keys == 1024
        ours, routed = run()
    finally:
        da.uninstall(model)
    layers = sum(1 for m in model.modules() if type(m).__name__.endswith("Attention"))
    assert routed == [layers, layers]  # every attention layer took the host path
    for s, o in zip(stock, ours):
        assert mx.abs(s - o).max().item() <= 1e-4
        assert mx.array_equal(s.argmax(-1), o.argmax(-1))


def test_install_covers_the_modules_the_layers_live_in_and_uninstall_restores():
    stock = mlx_base.scaled_dot_product_attention
    dsa = build_model("glm_moe_dsa")  # its attention is deepseek_v32's class
    assert [m.__name__ for m in da.model_modules(dsa)] == ["mlx_lm.models.deepseek_v32"]
    assert da.install(dsa)
    try:
        assert deepseek_v32.scaled_dot_product_attention is not stock
        assert llama.scaled_dot_product_attention is stock  # other models' modules untouched
        assert _blas_threads() == [1]
    finally:
        da.uninstall(dsa)
    assert deepseek_v32.scaled_dot_product_attention is stock
    assert not da.install(build_model("mamba2"))  # no attention layer


def _blas_threads() -> list[int]:
    return sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
