"""A prefill chunk's dense layers on the host BLAS (engine/kernels/host_linear.py).

Every tiny architecture: a prompt prefilled in chunks on the host path then
decoded gives the stock model's logits to float32 rounding and its greedy
tokens; the chunks take the host path and the decode steps (one row per
sequence) MLX's; the same chunks give the same numbers every time; a
function transformation (mx.compile) falls back to MLX's path; other dtypes
are left alone; install swaps exactly the stock instances and uninstall gives
them back, and the host BLAS is on one thread only while installed.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from threadpoolctl import threadpool_info

from engine.kernels import host_blas, host_linear
from engine.kernels.host_linear import HostLinear
from engine.runtime.model.tiny_models import ARCHS, build_model

PROMPT = list(range(5, 5 + 70))
CHUNK = 32  # rows of a chunk: over MIN_ROWS


def _run(model, steps: int = 4) -> tuple[list, list]:
    """Logits of the prompt's last position and of `steps` greedy decode steps; the tokens."""
    cache = make_prompt_cache(model)
    ids = mx.array([PROMPT])
    for i in range(0, len(PROMPT) - 1, CHUNK):  # prefill, chunk by chunk, all but the last
        model(ids[:, i : min(i + CHUNK, len(PROMPT) - 1)], cache=cache)
        mx.eval([c.state for c in cache])
    y = ids[:, -1:]
    logits, tokens = [], []
    for _ in range(steps + 1):
        out = model(y, cache=cache)[:, -1, :]
        mx.eval(out)
        logits.append(out)
        y = mx.argmax(out, axis=-1)[:, None]
        tokens.append(y.item())
    return logits, tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_host_path_gives_the_stock_logits_and_tokens(arch):
    model = build_model(arch)
    stock_logits, stock_tokens = _run(model)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert host_linear.install(model) == (linears > 0)
    try:
        before = dict(host_linear.ROUTED)
        logits, tokens = _run(model)
        again, _ = _run(model)
        routed = {k: v - before.get(k, 0) for k, v in host_linear.ROUTED.items()}
    finally:
        host_linear.uninstall(model)
    if linears:
        assert routed["host"] >= linears * 3, "the prefill chunks took MLX's path"
        assert routed["stock"] >= linears * 5, "a decode step took the host path"
    assert tokens == stock_tokens
    for a, b in zip(logits, stock_logits, strict=True):
        assert mx.allclose(a, b, rtol=1e-4, atol=1e-4).item()
    for a, b in zip(again, logits, strict=True):  # the same chunks: the same numbers
        assert mx.array_equal(a, b).item()


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bfloat16", "float16"])
def test_half_precision_layers_multiply_in_float32_and_keep_their_dtype(dtype):
    model = build_model("qwen3_next")
    model.set_dtype(dtype)
    stock_logits, stock_tokens = _run(model)
    assert host_linear.install(model)
    try:
        before = host_linear.ROUTED["host"]
        logits, tokens = _run(model)
        routed = host_linear.ROUTED["host"] - before
    finally:
        host_linear.uninstall(model)
    assert routed > 0, "the half-precision chunks took MLX's path"
    assert all(a.dtype == dtype for a in logits)
    assert tokens == stock_tokens
    for a, b in zip(logits, stock_logits, strict=True):  # the inputs' own rounding
        assert mx.allclose(a.astype(mx.float32), b.astype(mx.float32), atol=0.1).item()
    mx.random.seed(7)
    layer = nn.Linear(24, 40)
    layer.set_dtype(dtype)
    x = mx.random.normal((2, 20, 24)).astype(dtype)
    expected = x.astype(mx.float32) @ layer.weight.astype(mx.float32).T
    expected = expected + layer.bias.astype(mx.float32)  # the float32 product
    layer.__class__ = HostLinear
    got = layer(x)
    assert got.dtype == dtype
    assert mx.allclose(got.astype(mx.float32), expected, rtol=1e-2, atol=1e-2).item()


def test_the_host_product_is_the_linear_map_with_its_bias():
    layer = nn.Linear(24, 40, bias=True)
    x = mx.random.normal((3, 7, 24))
    expected = layer(x)
    layer.__class__ = HostLinear
    before = host_linear.ROUTED["host"]
    got = layer(x)
    assert host_linear.ROUTED["host"] == before + 1
    assert got.shape == (3, 7, 40) and got.dtype == mx.float32
    assert np.allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_short_inputs_other_dtypes_and_transformations_keep_mlx_path():
    layer = nn.Linear(16, 16)
    layer.__class__ = HostLinear
    before = dict(host_linear.ROUTED)

    def routed(key):
        return host_linear.ROUTED[key] - before.get(key, 0)

    layer(mx.ones((1, 4, 16)))  # a decode-sized input: 4 rows
    assert routed("stock") == 1 and routed("host") == 0
    half = nn.Linear(16, 16)
    half.set_dtype(mx.bfloat16)
    half.__class__ = HostLinear
    out = half(mx.ones((1, 64, 16)))  # a float32 input into a bfloat16 layer: mixed
    assert out.dtype == mx.float32 and routed("host") == 0
    compiled = mx.compile(lambda x: layer(x))
    x = mx.random.normal((2, 32, 16))
    assert mx.allclose(compiled(x), x @ layer.weight.T + layer.bias).item()
    assert routed("host") == 0, "the host path ran inside mx.compile"


def test_install_swaps_the_stock_instances_and_one_blas_thread_while_installed():
    model = build_model("qwen3_next")
    before = [type(m) for m in model.modules()]
    assert host_linear.install(model, min_rows=8)
    during = [type(m) for m in model.modules()]
    assert nn.Linear not in during
    assert all(m.min_rows == 8 for m in model.modules() if type(m) is HostLinear)
    assert [nn.Linear if t is HostLinear else t for t in during] == before
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    assert blas and all(i["num_threads"] == 1 for i in blas)
    assert host_linear.NAME in host_blas.held()
    host_linear.uninstall(model)
    assert [type(m) for m in model.modules()] == before
    assert host_linear.NAME not in host_blas.held()
    with pytest.raises(ValueError, match="min_rows"):
        host_linear.install(model, min_rows=0)
