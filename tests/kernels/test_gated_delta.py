"""mx.fast.gated_delta_update and the host recurrence equal mlx-lm's per-token op loop
(engine/kernels/gated_delta.py).

Kept whichever way the dispatch goes (``auto`` takes the primitive off Metal,
where it measured as fast or faster on CPU, and the host recurrence for a
chunk on the CPU): scalar and per-key gates, grouped heads, padding masks,
and whole tiny qwen3_next and kimi_linear forwards.
"""

from __future__ import annotations

import importlib

import mlx.core as mx
import pytest
from mlx_lm.models import gated_delta as mlx_gd
from mlx_lm.models.cache import ArraysCache

from engine.kernels import gated_delta as gd
from engine.kernels import host_blas
from engine.runtime.model.tiny_models import build_model

TOL = 1e-5


def _rel(a, b) -> float:
    return (mx.linalg.norm((a - b).flatten()) / mx.linalg.norm(b.flatten())).item()


@pytest.mark.parametrize("vector_gate", [False, True], ids=["scalar-gate", "per-key-gate"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "left-padded"])
@pytest.mark.parametrize("steps", [1, 37])
@pytest.mark.parametrize("host", [False, True], ids=["primitive", "host"])
def test_fast_primitive_and_host_equal_the_op_loop(vector_gate, masked, steps, host, monkeypatch):
    monkeypatch.setattr(gd, "_host_min_steps", 16 if host else None)
    before = dict(gd.ROUTED)
    mx.random.seed(steps)
    B, Hk, Hv, Dk, Dv = 2, 2, 4, 32, 16
    q = mx.random.normal((B, steps, Hk, Dk)) * 0.2
    k = mx.random.normal((B, steps, Hk, Dk)) * 0.2
    v = mx.random.normal((B, steps, Hv, Dv))
    a = mx.random.normal((B, steps, Hv, Dk) if vector_gate else (B, steps, Hv))
    b = mx.random.normal((B, steps, Hv))
    A_log = mx.random.normal((Hv, Dk) if vector_gate else (Hv,)) * 0.1
    dt_bias = mx.random.normal((Hv, Dk) if vector_gate else (Hv,)) * 0.1
    state = mx.random.normal((B, Hv, Dv, Dk)) * 0.1
    mask = None
    if masked:  # row 1 starts with `pad` padding steps
        pad = steps // 2
        mask = mx.array([[True] * steps, [False] * pad + [True] * (steps - pad)])
    y0, s0 = mlx_gd.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask)
    y1, s1 = gd.fast_gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask)
    routed = {k: v - before.get(k, 0) for k, v in gd.ROUTED.items()}
    assert routed.get("host", 0) == int(host and steps >= 16)
    assert s1.dtype == s0.dtype and y1.dtype == y0.dtype and y1.shape == y0.shape
    assert _rel(s1, s0) <= TOL
    if mask is not None:  # outputs at padding steps are nobody's: the primitive writes zeros
        keep = mask[:, :, None, None]
        assert not mx.where(keep, 0, y1).any().item()
        y0, y1 = mx.where(keep, y0, 0), mx.where(keep, y1, 0)
    assert _rel(y1, y0) <= TOL


@pytest.mark.parametrize("arch", ["qwen3_next", "kimi_linear"])  # scalar, per-key gates
@pytest.mark.parametrize("mode", ["fast", "auto"])
def test_installed_dispatch_gives_the_stock_forward(mode, arch):
    model = build_model(arch)
    module = importlib.import_module(type(model).__module__)
    tokens = mx.array([[5, 17, 300, 42, 99, 1000, 7, 8, 9, 10, 11, 12] * 2])
    stock_cache = model.make_cache()
    stock = [model(tokens, cache=stock_cache), model(tokens[:, :1], cache=stock_cache)]
    assert gd.install(model, mode)
    try:
        assert module.gated_delta_update is gd.fast_gated_delta_update
        assert gd.host_active() == (mode == "auto")  # auto on the CPU: chunks on the host
        assert (gd.HOST in host_blas.held()) == (mode == "auto")  # its BLAS on one thread
        before = dict(gd.ROUTED)
        cache = model.make_cache()
        ours = [model(tokens, cache=cache), model(tokens[:, :1], cache=cache)]  # chunk, step
        routed = {k: v - before.get(k, 0) for k, v in gd.ROUTED.items()}
        for a, b in zip(ours, stock, strict=True):
            assert _rel(a, b) <= TOL
        assert any(isinstance(c, ArraysCache) for c in cache)
    finally:
        gd.uninstall(model)
    layers = sum(1 for c in cache if isinstance(c, ArraysCache))
    if mode == "auto":  # the 24-token chunk on the host, the decode step on the primitive
        assert routed == {"host": layers, "fast": layers}
    else:
        assert routed.get("host", 0) == 0 and routed["fast"] == 2 * layers
    assert module.gated_delta_update is mlx_gd.gated_delta_update
    assert not gd.host_active() and gd.HOST not in host_blas.held()


def test_auto_takes_the_primitive_off_metal_and_bad_modes_are_refused():
    assert mx.default_device() == mx.cpu
    assert gd.resolve("auto") and not gd.resolve("ops") and gd.resolve("fast")
    with pytest.raises(ValueError, match="gated delta mode"):
        gd.resolve("turbo")
    assert not gd.install(build_model("llama"), "fast")  # no gated delta in it
