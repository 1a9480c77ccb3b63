"""Training's matrix products on the host BLAS: MLX custom functions with their own gradients.

MLX's CPU backend (the `mlx[cpu]` wheel) multiplies matrices with the reference BLAS it
ships, about 6 GFLOP/s on this project's machine, while numpy's OpenBLAS does ~75 on
one thread. A small model's training step is mostly matrix products (the lm_head over
a 4096-token vocabulary, the projections, attention's scores), so training moves these
three to numpy and leaves everything else (norms, the gated delta recurrence, rope,
the optimizer) to MLX:

- `host_cross_entropy(hidden, weight, targets)`: the lm_head and its mean cross entropy,
  never materializing the logits in MLX;
- `HostLinear`: `nn.Linear` whose product runs in numpy (`install` swaps the class of
  every bias-free Linear of a module; the parameter tree does not change);
- `host_attention`: causal GQA attention (`scaled_dot_product_attention` with the
  "causal" mask), standing in for mlx-lm's while `install` is in effect.

Each forward evaluates its inputs (numpy reads MLX's buffers), so these run eagerly
and one after another; each backward recomputes what it needs from the primals. The
arithmetic is float32 throughout, one BLAS thread (the caller holds threadpoolctl's
limit), so the same inputs give the same bits on the same machine.

It knows MLX, numpy and mlx-lm's qwen3_next module; it is for training only and the
engine never imports it.
"""

from __future__ import annotations

from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def _np(a: mx.array) -> np.ndarray:
    return np.asarray(a.astype(mx.float32) if a.dtype != mx.float32 else a)


# ---------------------------------------------------------------- lm_head + cross entropy


def _shifted_logits(hidden: mx.array, weight: mx.array) -> tuple[np.ndarray, np.ndarray]:
    """(hidden as [N, H], logits [N, V] minus each row's max)."""
    h = _np(hidden).reshape(-1, hidden.shape[-1])
    z = h @ _np(weight).T
    z -= z.max(axis=-1, keepdims=True)
    return h, z


@mx.custom_function
def host_cross_entropy(hidden: mx.array, weight: mx.array, targets: mx.array) -> mx.array:
    """Mean over positions of cross_entropy(hidden @ weight.T, targets)."""
    _, z = _shifted_logits(hidden, weight)
    y = np.asarray(targets).reshape(-1)
    loss = np.log(np.exp(z).sum(axis=-1)) - z[np.arange(len(y)), y]
    return mx.array(loss.mean(dtype=np.float64).astype(np.float32))


@host_cross_entropy.vjp
def _host_cross_entropy_vjp(primals, cotangent, output):
    hidden, weight, targets = primals
    h, z = _shifted_logits(hidden, weight)
    y = np.asarray(targets).reshape(-1)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0  # d loss / d logits, before the mean and the cotangent
    p *= np.float32(np.asarray(cotangent)) / len(y)
    grad_hidden = (p @ _np(weight)).reshape(hidden.shape)
    return mx.array(grad_hidden), mx.array(p.T @ h), mx.zeros_like(targets)


# ---------------------------------------------------------------- linear layers


@mx.custom_function
def host_matmul_t(x: mx.array, w: mx.array) -> mx.array:
    """x @ w.T for x [..., in] and w [out, in]."""
    return mx.array(_np(x) @ _np(w).T)


@host_matmul_t.vjp
def _host_matmul_t_vjp(primals, cotangent, output):
    x, w = primals
    g = _np(cotangent)
    g2, x2 = g.reshape(-1, g.shape[-1]), _np(x).reshape(-1, x.shape[-1])
    return mx.array(g @ _np(w)), mx.array(g2.T @ x2)


class HostLinear(nn.Linear):
    """A bias-free `nn.Linear` whose product runs on the host BLAS."""

    def __call__(self, x: mx.array) -> mx.array:
        return host_matmul_t(x, self.weight)


# ---------------------------------------------------------------- attention


def _grouped(q: mx.array, k: mx.array, v: mx.array):
    """q [B, Hq, L, D] -> [B, Hk, G, L, D]; k, v [B, Hk, S, D] -> [B, Hk, 1, S, D]."""
    b, hq, n, d = q.shape
    hk = k.shape[1]
    return (
        _np(q).reshape(b, hk, hq // hk, n, d),
        _np(k)[:, :, None],
        _np(v)[:, :, None],
    )


def _causal_probs(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(scale)
    n, m = s.shape[-2:]
    s[..., np.triu(np.ones((n, m), dtype=bool), k=m - n + 1)] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p


@mx.custom_function
def _host_attention(q: mx.array, k: mx.array, v: mx.array, scale: mx.array) -> mx.array:
    qg, kg, vg = _grouped(q, k, v)
    out = _causal_probs(qg, kg, scale.item()) @ vg
    return mx.array(out.reshape(q.shape[:3] + (v.shape[-1],)))


@_host_attention.vjp
def _host_attention_vjp(primals, cotangent, output):
    q, k, v, scale = primals
    qg, kg, vg = _grouped(q, k, v)
    p = _causal_probs(qg, kg, scale.item())
    do = _np(cotangent).reshape(qg.shape[:4] + (v.shape[-1],))
    dv = (np.swapaxes(p, -1, -2) @ do).sum(axis=2)
    dp = do @ np.swapaxes(vg, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * np.float32(scale.item())
    dq = (ds @ kg).reshape(q.shape)
    dk = (np.swapaxes(ds, -1, -2) @ qg).sum(axis=2)
    return mx.array(dq), mx.array(dk), mx.array(dv), mx.zeros_like(scale)


def host_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's `scaled_dot_product_attention` for training: causal, no cache, on the host."""
    if cache is not None or sinks is not None or (mask is not None and mask != "causal"):
        raise ValueError("host_attention serves training only: causal, no cache, no sinks")
    return _host_attention(queries, keys, values, mx.array(scale, dtype=mx.float32))


# ---------------------------------------------------------------- install


@contextmanager
def install(module: nn.Module):
    """Within the block, `module`'s bias-free Linears and qwen3_next's attention run on
    the host; both are put back after it."""
    from mlx_lm.models import qwen3_next

    swapped = [m for _, m in module.named_modules() if type(m) is nn.Linear and "bias" not in m]
    stock = qwen3_next.scaled_dot_product_attention
    for m in swapped:
        m.__class__ = HostLinear
    qwen3_next.scaled_dot_product_attention = host_attention
    try:
        yield
    finally:
        qwen3_next.scaled_dot_product_attention = stock
        for m in swapped:
            m.__class__ = nn.Linear
