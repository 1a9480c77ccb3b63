"""Gated delta rule off Metal: mlx-lm's per-token op loop or ``mx.fast.gated_delta_update``.

mlx-lm's ``gated_delta_update`` (qwen3_next, qwen3_5, kimi_linear, olmo_hybrid,
...) runs its Metal kernel on Apple GPUs and otherwise a Python loop of ops,
one step per token. MLX ships ``mx.fast.gated_delta_update``, the whole
recurrence as one primitive. This module installs a dispatcher in the model's
own mlx-lm module (the name it imported), which keeps mlx-lm's gate and beta
computation and hands the recurrence to the fast primitive; Metal keeps
mlx-lm's kernel.

Measured with ``lineage bench kernels`` (docs/benchmarks.md, which has the
figures): on the CPU the primitive is bit-identical to the op loop and faster
from 128 steps up (within noise at 1 and 16 steps), so ``auto`` uses it
everywhere off Metal: CPU, and CUDA, where mlx-lm also falls back to the op
loop (not measured on CUDA).
Outputs at masked (padding) steps differ: the primitive writes zeros, the op
loop a value nobody reads; the state is identical.

It knows mlx-lm's gated-delta helpers; nothing of the engine.
"""

from __future__ import annotations

import importlib
from typing import Optional

import mlx.core as mx
from mlx_lm.models import gated_delta as _mlx_gated_delta

MODES = ("auto", "fast", "ops")
FAST = "gated-delta-fast"

_stock = _mlx_gated_delta.gated_delta_update


def fast_gated_delta_update(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    a: mx.array,
    b: mx.array,
    A_log: mx.array,
    dt_bias: mx.array,
    state: Optional[mx.array] = None,
    mask: Optional[mx.array] = None,
    *,
    use_kernel: bool = True,
    lower_bound: float | None = None,
    allow_neg_eigval: bool = False,
):
    """mlx-lm's ``gated_delta_update`` with the recurrence in ``mx.fast.gated_delta_update``."""
    if not use_kernel or (mx.default_device() == mx.gpu and mx.metal.is_available()):
        return _stock(
            q, k, v, a, b, A_log, dt_bias, state, mask,
            use_kernel=use_kernel, lower_bound=lower_bound, allow_neg_eigval=allow_neg_eigval,
        )  # fmt: skip
    beta = mx.sigmoid(b)
    if allow_neg_eigval:
        beta = beta * 2.0
    if lower_bound is None:
        g = _mlx_gated_delta.compute_g(A_log, a, dt_bias)
    else:
        g = _mlx_gated_delta.compute_lower_bound_g(A_log, a, dt_bias, lower_bound)
    if state is None:
        B, _, _, Dk = q.shape
        Hv, Dv = v.shape[-2:]
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    y, state = mx.fast.gated_delta_update(q, k, v, g, beta, state, mask)
    return y, state


def resolve(mode: str) -> bool:
    """Whether `mode` dispatches to the fast primitive on this device."""
    if mode not in MODES:
        raise ValueError(f"gated delta mode {mode!r} is not one of {', '.join(MODES)}")
    if not hasattr(mx.fast, "gated_delta_update"):
        return False
    if mode == "auto":  # off Metal, where mlx-lm has its own kernel
        return not (mx.default_device() == mx.gpu and mx.metal.is_available())
    return mode == "fast"


def _model_module(model):
    module = importlib.import_module(type(model).__module__)
    return module if getattr(module, "gated_delta_update", None) is not None else None


def install(model, mode: str) -> bool:
    """Point the model's mlx-lm module at the fast dispatcher when `mode` says so."""
    module = _model_module(model)
    if module is None or not resolve(mode):
        return False
    module.gated_delta_update = fast_gated_delta_update
    return True


def uninstall(model) -> None:
    """Give the model's mlx-lm module mlx-lm's own ``gated_delta_update`` back."""
    module = _model_module(model)
    if module is not None:
        module.gated_delta_update = _stock
