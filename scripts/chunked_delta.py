"""The gated delta rule in chunks, for training: mlx-lm's recurrence, the same sums regrouped.

mlx-lm's `gated_delta_ops` (what the CPU runs) loops over time steps and slices
`q[:, t]` each step; the gradient of every slice is a zero array of the whole sequence
with one row filled, so a backward pass over T steps moves O(T^2) memory, and a
training step of a 256-token batch spends most of its time there. Here the sequence
goes in chunks of C tokens (the chunkwise form of Yang et al., "Gated Delta Networks"):
within a chunk everything is a handful of C x C matrix products; only the state passes
from chunk to chunk, T / C times.

Per head, with S the state (Dv x Dk), gamma_t the product of the decays g_1..g_t
within the chunk, and beta_t the write strength, the recurrence

    S_t = g_t S_{t-1} + beta_t (v_t - g_t S_{t-1} k_t) k_t^T,    y_t = S_t q_t

equals, for a chunk entered with state S0,

    U = (I + A)^-1 diag(beta) (V - diag(gamma) K S0^T)
    Y = diag(gamma) Q S0^T + (M o Q K^T) U
    S_C = gamma_C S0 + U^T diag(gamma_C / gamma) K

with A[t,i] = beta_t gamma_t/gamma_i k_t.k_i for i < t (0 elsewhere) and
M[t,i] = gamma_t/gamma_i for i <= t (0 elsewhere)

and (I + A)^-1 of the nilpotent A is the finite product of (I + (-A)^(2^j)).
The test holds it to mlx-lm's recurrence: outputs, final state and gradients.

It knows mlx-lm's gated delta shapes; it is for training only and the engine never
imports it.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

CHUNK = 16


def _inverse_unit_lower(a: mx.array) -> mx.array:
    """(I + a)^-1 for strictly lower-triangular a [..., C, C], C a power of two."""
    c = a.shape[-1]
    power = -a
    result = mx.eye(c, dtype=a.dtype) + power
    for _ in range(int(math.log2(c)) - 1):
        power = power @ power
        result = result + result @ power
    return result


def _blocks(x: mx.array, chunk: int) -> mx.array:
    """[B, T, H, ...] -> [B, H, T / chunk, chunk, ...]."""
    b, t, h = x.shape[:3]
    return mx.moveaxis(x.reshape(b, t // chunk, chunk, h, *x.shape[3:]), 3, 1)


def gated_delta_chunked(q, k, v, log_g, beta, state=None, chunk: int = CHUNK):
    """`gated_delta_ops(q, k, v, exp(log_g), beta, state)` without a mask, scalar gates only.

    The decay comes as its log: a gate near zero has a gradient through log g that
    g itself cannot carry (d/dg = d/dlog g / g).
    q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; log_g, beta [B, T, Hv]; state [B, Hv, Dv, Dk].
    Returns (y [B, T, Hv, Dv], final state)."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[-2:]
    if log_g.ndim != 3:
        raise ValueError(f"scalar gates only, got log_g of shape {log_g.shape}")
    if hv > hk:
        q, k = mx.repeat(q, hv // hk, -2), mx.repeat(k, hv // hk, -2)
    pad = (-t) % chunk
    if pad:  # padded steps keep the state: nothing written (beta 0), no decay (log g 0)
        zeros = [(0, 0), (0, pad)]
        q, k, v = (mx.pad(x, zeros + [(0, 0), (0, 0)]) for x in (q, k, v))
        log_g, beta = (mx.pad(x, zeros + [(0, 0)]) for x in (log_g, beta))
    q, k, v = (_blocks(x.astype(mx.float32), chunk) for x in (q, k, v))  # [B, H, N, C, D]
    beta = _blocks(beta.astype(mx.float32), chunk)  # [B, H, N, C]
    log_gamma = mx.cumsum(_blocks(log_g.astype(mx.float32), chunk), axis=-1)

    # 1) Within each chunk, all chunks at once: nothing here depends on the state.
    lower = mx.tril(mx.ones((chunk, chunk), dtype=mx.bool_))
    ratio = log_gamma[..., :, None] - log_gamma[..., None, :]  # log gamma_t / gamma_i
    decay = mx.exp(mx.where(lower, ratio, -mx.inf))  # M: zero above the diagonal
    strict = decay * (1 - mx.eye(chunk))
    a = beta[..., None] * strict * (k @ k.swapaxes(-1, -2))
    weights = _inverse_unit_lower(a) * beta[..., None, :]  # (I + A)^-1 diag(beta)
    gamma = mx.exp(log_gamma)[..., None]
    u_values = weights @ v  # [B, H, N, C, Dv]
    u_state = weights @ (gamma * k)  # [B, H, N, C, Dk]: U = u_values - u_state S0^T
    scores = decay * (q @ k.swapaxes(-1, -2))
    q_gamma = gamma * q
    k_tail = mx.exp(log_gamma[..., -1:] - log_gamma)[..., None] * k
    gamma_end = mx.exp(log_gamma[..., -1])[..., None, None]  # [B, H, N, 1, 1]

    # 2) Chunk to chunk: the state's recurrence.
    s = mx.zeros((b, hv, dv, dk), mx.float32) if state is None else state.astype(mx.float32)
    n = u_values.shape[2]
    parts = [mx.split(x, n, axis=2) for x in (u_values, u_state, scores, q_gamma, k_tail)]
    ends = mx.split(gamma_end, n, axis=2)
    ys = []
    for i in range(n):
        uv, us, sc, qg, kt = (p[i].squeeze(2) for p in parts)
        u = uv - us @ s.swapaxes(-1, -2)
        ys.append(qg @ s.swapaxes(-1, -2) + sc @ u)
        s = ends[i].squeeze(2) * s + u.swapaxes(-1, -2) @ kt
    y = mx.stack(ys, axis=2).reshape(b, hv, -1, dv)[:, :, :t]
    return mx.moveaxis(y, 1, 2).astype(v.dtype), s


def gated_delta_update(
    q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *, use_kernel=True, **gates
):
    """mlx-lm's `gated_delta_update` for training: the chunked form, no mask, scalar gates."""
    if mask is not None or gates:
        raise ValueError("the chunked gated delta serves training only: no mask, plain gates")
    # log of mlx-lm's compute_g: g = exp(-exp(A_log) * softplus(a + dt_bias))
    log_g = -mx.exp(A_log.astype(mx.float32)) * nn.softplus(a + dt_bias)
    return gated_delta_chunked(q, k, v, log_g, mx.sigmoid(b), state)


@contextmanager
def install():
    """Within the block, mlx-lm's qwen3_next layers run the chunked form."""
    from mlx_lm.models import qwen3_next

    stock = qwen3_next.gated_delta_update
    qwen3_next.gated_delta_update = gated_delta_update
    try:
        yield
    finally:
        qwen3_next.gated_delta_update = stock
