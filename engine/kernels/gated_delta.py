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

On the CPU the primitive runs a chunk's recurrence slowly (256 steps of the
tiny qwen3_next's layer: 21-35 ms; 64 steps at Qwen3-Next's 32 heads of 128 x
128: 112 ms), and once a prefill chunk's dense layers and attention ran on the
host BLAS it was the larger half of the chunk. So under ``auto`` on the CPU a
call of at least ``host_min_steps`` steps (a prefill chunk; a decode step
stays on the primitive, inside the step's asynchronous graph) runs the
recurrence in numpy (`host_recurrence`): the gate and beta computed as above,
the inputs evaluated and viewed, one step at a time with the state in float32
(3.6 ms and 26 ms for the two cases above), the outputs copied back (its
per-step products are the host BLAS's, on one thread while it is on:
engine.kernels.host_blas). It equals the op loop to float32 rounding (tested
within 1e-5, as the primitive); masked steps keep the state and output zeros,
as the primitive.

It knows mlx-lm's gated-delta helpers and numpy; nothing of the engine.
"""

from __future__ import annotations

import importlib
from collections import Counter
from typing import Optional

import mlx.core as mx
import numpy as np
from mlx_lm.models import gated_delta as _mlx_gated_delta

from engine.kernels import host_blas

MODES = ("auto", "fast", "ops")
FAST = "gated-delta-fast"
HOST = "gated-delta-host"
HOST_MIN_STEPS = 16  # default: calls of at least this many steps run on the host (auto, CPU)
# Recurrences run each way since import ("host", "fast"): the tests read it.
ROUTED: Counter = Counter()

_stock = _mlx_gated_delta.gated_delta_update
_host_min_steps: int | None = None  # set by install under auto on the CPU; None: never


def host_recurrence(q, k, v, g, beta, state, mask=None):
    """The gated delta recurrence in numpy, one step at a time: mx.fast's (y, state).

    q, k (B, T, Hk, Dk); v (B, T, Hv, Dv); g (B, T, Hv) or (B, T, Hv, Dk); beta
    (B, T, Hv); state (B, Hv, Dv, Dk); mask None or (B, T), True where a step counts.
    """
    B, T, Hk, _ = q.shape
    Hv = v.shape[-2]
    arrays = [a.astype(mx.float32) for a in (q, k, v, g, beta, state)]
    mx.eval(arrays + ([] if mask is None else [mask]))
    qn, kn, vn, gn, bn, sn = (np.asarray(a) for a in arrays)
    if Hv // Hk > 1:
        qn, kn = np.repeat(qn, Hv // Hk, axis=2), np.repeat(kn, Hv // Hk, axis=2)
    s = sn  # never written in place: each step makes the next state
    keep = None if mask is None else np.asarray(mask).astype(bool)
    y = np.zeros(vn.shape, dtype=np.float32)
    for t in range(T):
        gt = gn[:, t]
        decay = gt[..., None, None] if gt.ndim == 2 else gt[:, :, None, :]
        new = s * decay
        kt = kn[:, t]
        kv = np.matmul(new, kt[..., None])[..., 0]  # (B, Hv, Dv)
        delta = (vn[:, t] - kv) * bn[:, t][..., None]
        new += delta[..., None] * kt[:, :, None, :]
        yt = np.matmul(new, qn[:, t][..., None])[..., 0]
        if keep is None:
            s, y[:, t] = new, yt
        else:
            m = keep[:, t]
            s = np.where(m[:, None, None, None], new, s)
            y[:, t] = np.where(m[:, None, None], yt, 0.0)
    return mx.array(y).astype(q.dtype), mx.array(s).astype(state.dtype)


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
    if _host_min_steps is not None and q.shape[1] >= _host_min_steps:
        try:
            out = host_recurrence(q, k, v, g, beta, state, mask)
        except (RuntimeError, ValueError):  # inside mx.compile or vmap: nothing is evaluated
            out = None
        if out is not None:
            ROUTED["host"] += 1
            return out
    ROUTED["fast"] += 1
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


def install(model, mode: str, host_min_steps: int | None = HOST_MIN_STEPS) -> bool:
    """Point the model's mlx-lm module at the fast dispatcher when `mode` says so; under
    ``auto`` on the CPU, calls of at least `host_min_steps` steps run on the host (None:
    never). Process-wide, as the module patch."""
    global _host_min_steps
    module = _model_module(model)
    if module is None or not resolve(mode):
        return False
    module.gated_delta_update = fast_gated_delta_update
    on_host = mode == "auto" and mx.default_device() == mx.cpu and host_min_steps is not None
    _host_min_steps = host_min_steps if on_host else None
    (host_blas.hold if on_host else host_blas.let_go)(HOST)  # its matmuls are the host BLAS's
    return True


def host_active() -> bool:
    """Whether chunks run the recurrence on the host (install's last word)."""
    return _host_min_steps is not None


def uninstall(model) -> None:
    """Give the model's mlx-lm module mlx-lm's own ``gated_delta_update`` back."""
    global _host_min_steps
    _host_min_steps = None
    host_blas.let_go(HOST)
    module = _model_module(model)
    if module is not None:
        module.gated_delta_update = _stock
