"""Dense attention on the CPU backend through the host BLAS, at long contexts.

mlx-lm's attention layers call ``scaled_dot_product_attention`` (mlx-lm's
``models/base.py``), which calls ``mx.fast.scaled_dot_product_attention``. On
Metal and CUDA that is one fused kernel; on MLX's CPU backend it is a
composition of ops that are slow at long contexts (mlx 0.32): its ``mx.exp``
and its small matmuls take many times numpy's and OpenBLAS's time (``lineage
bench kernels`` shows the ratio). So a prompt token at a long context cost
several idle decode steps of the tiny qwen3_next, and a chunk of prefill beside
decode stretched every stream's inter-token gap.

``host_attention`` does the same attention on the host: it evaluates the
queries, keys, values (and an array mask), takes zero-copy numpy views of
their MLX buffers, and computes, per KV head, the GQA group's scores with one
BLAS matmul, the softmax with numpy, the output with a second matmul; only
the small output is copied back into MLX. It handles what the model loop
passes: any batch (``BatchKVCache``'s left-padded boolean masks), mask None,
``"causal"`` (lower-right aligned, as MLX's) or an array (boolean or
additive, broadcast over heads or per head), keys and values of different
head dims. A fully masked row is uniform, as MLX's. Masking touches only the
key columns that some query masks (the causal block of a chunk, the left
padding).

The dispatcher takes that path on the CPU device when the keys are at least
``min_keys`` long, or when a chunk of at least ``CHUNK_ROWS`` queries (a
prefill chunk, not a decode step or a speculative verify) meets at least
``chunk_min_keys`` keys, and the arrays are float32. A chunk's scores are a
real matrix product where MLX's CPU backend is slowest (the dense layers on
the host BLAS made attention a third of a 256-token chunk of the tiny
qwen3_next): a 1,280-token prompt prefilled 1.6-1.8x faster with chunks
taking it from 128 keys than from 1,024, and slower from 1 key (the first
chunk's few keys); a decode step's one query crosses over only between 1,024
and 2,048 keys; everything else goes to the
stock function: quantized KV caches (``bits``), attention sinks, other
dtypes (numpy has no BLAS for bfloat16 or float16), short contexts, and any
device but the CPU. It is installed by pointing the model's own mlx-lm
modules (those its layers' classes live in, each of which imported the name
from ``base``) at the dispatcher; uninstall puts mlx-lm's function back. The
host BLAS runs on one thread while installed (engine.kernels.host_blas).

It knows mlx-lm's attention helper; nothing of the engine.
"""

from __future__ import annotations

import importlib
from collections import Counter

import mlx.core as mx
import numpy as np
from mlx_lm.models import base as _mlx_base

from engine.kernels import host_blas

NAME = "dense-attention-host"
MIN_KEYS = 1024  # default dispatch threshold, in keys (docs/benchmarks.md)
CHUNK_ROWS = 16  # queries of a call that make it a chunk
CHUNK_MIN_KEYS = 128  # default threshold, in keys, for a chunk
# Calls routed each way since import ("host", "stock"): the tests read it.
ROUTED: Counter = Counter()

_stock = _mlx_base.scaled_dot_product_attention
_INSTALLED: dict[str, object] = {}  # module name -> the function it had before install


def host_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask):
    """softmax(scale * q k^T + mask) v on the host BLAS -> (B, H, L, Dv), queries' dtype.

    queries (B, H, L, D); keys (B, Hkv, T, D); values (B, Hkv, T, Dv), H a
    multiple of Hkv; mask None, "causal" or an array broadcastable to
    (B, H, L, T), boolean (True keeps) or additive.
    """
    B, H, L, D = queries.shape
    Hkv, T = keys.shape[1], keys.shape[2]
    rep = H // Hkv
    arrays = [queries, keys, values] + ([mask] if isinstance(mask, mx.array) else [])
    mx.eval(*arrays)
    q = np.asarray(queries)
    k = np.asarray(keys)
    v = np.asarray(values)
    # (B, Hkv, rep * L, D): a GQA group's queries are one matrix against its KV head.
    q = q.reshape(B, Hkv, rep * L, D) * np.float32(scale)
    s = np.matmul(q, k.swapaxes(-1, -2))  # (B, Hkv, rep * L, T)
    s = s.reshape(B, Hkv, rep, L, T)
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        if L > 1:
            _apply_causal(s, L, T)
    elif mask is not None:
        _apply_mask(s, np.asarray(mask), Hkv, rep)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    total = s.sum(axis=-1, keepdims=True)  # (B, Hkv, rep, L, 1)
    s = s.reshape(B, Hkv, rep * L, T)
    out = np.matmul(s, v)  # (B, Hkv, rep * L, Dv)
    out = out.reshape(B, Hkv, rep, L, -1)
    out /= total
    return mx.array(out.reshape(B, H, L, -1)).astype(queries.dtype)


def _apply_causal(s: np.ndarray, L: int, T: int) -> None:
    """Mask key j > T - L + i for query i; only the last L columns can be masked."""
    block = s[..., T - L :]
    block[..., np.triu(np.ones((L, L), dtype=bool), k=1)] = np.finfo(np.float32).min


def _apply_mask(s: np.ndarray, mask: np.ndarray, Hkv: int, rep: int) -> None:
    """Apply an array mask to s (B, Hkv, rep, L, T) in place, on the columns it touches."""
    B, _, _, L, T = s.shape
    if mask.ndim < 4:
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    if mask.shape[1] == 1:
        m = mask[:, :, None]  # (mB, 1, 1, mL, T)
    else:
        m = mask.reshape(mask.shape[0], Hkv, rep, mask.shape[2], mask.shape[3])
    if m.dtype == np.bool_:
        # Columns every query keeps need nothing: only a leading and a trailing run
        # (left padding, a chunk's causal block) are touched, when that is the shape.
        masked = ~m.all(axis=tuple(range(m.ndim - 1)))
        if not masked.any():
            return
        lo, hi = _runs(masked)
        floor = np.finfo(np.float32).min
        for a, b in ((0, lo), (hi, T)) if lo <= hi else ((0, T),):
            if b > a:
                region = s[..., a:b]
                np.copyto(region, floor, where=~np.broadcast_to(m[..., a:b], region.shape))
    else:
        s += m


def _runs(masked: np.ndarray) -> tuple[int, int]:
    """(lo, hi): masked columns lie in [0, lo) and [hi, T); lo > hi when they do not."""
    T = masked.shape[0]
    kept = np.flatnonzero(~masked)
    if kept.size == 0:
        return T, 0
    lo, hi = int(kept[0]), int(kept[-1]) + 1
    if masked[lo:hi].any():
        return T, 0
    return lo, hi


def dispatcher(min_keys: int = MIN_KEYS, chunk_min_keys: int | None = CHUNK_MIN_KEYS):
    """A drop-in for mlx-lm's ``scaled_dot_product_attention``: the host path where it applies
    (``chunk_min_keys`` None: chunks too only from ``min_keys``)."""
    chunk_keys = min_keys if chunk_min_keys is None else min(min_keys, chunk_min_keys)

    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
        if (
            sinks is None
            and not hasattr(cache, "bits")
            and isinstance(keys, mx.array)
            and keys.shape[2] >= (chunk_keys if queries.shape[2] >= CHUNK_ROWS else min_keys)
            and queries.dtype == keys.dtype == values.dtype == mx.float32
            and mx.default_device() == mx.cpu
            and (mask is None or isinstance(mask, (str, mx.array)))
        ):
            ROUTED["host"] += 1
            return host_attention(queries, keys, values, scale, mask)
        ROUTED["stock"] += 1
        return _stock(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    scaled_dot_product_attention.min_keys = min_keys
    scaled_dot_product_attention.chunk_min_keys = chunk_keys
    return scaled_dot_product_attention


def model_modules(model) -> list:
    """The mlx-lm modules the model's layers live in that call mlx-lm's attention helper."""
    names = {type(model).__module__} | {type(m).__module__ for m in model.modules()}
    found = []
    for name in sorted(names):
        if not name.startswith("mlx_lm.models."):
            continue
        module = importlib.import_module(name)
        current = getattr(module, "scaled_dot_product_attention", None)
        if current is _stock or name in _INSTALLED:
            found.append(module)
    return found


def install(model, min_keys: int = MIN_KEYS, chunk_min_keys: int | None = CHUNK_MIN_KEYS) -> bool:
    """Route the model's dense attention through the host path on the CPU; whether it did."""
    if mx.default_device() != mx.cpu:
        return False
    modules = model_modules(model)
    for module in modules:
        _INSTALLED.setdefault(module.__name__, module.scaled_dot_product_attention)
        module.scaled_dot_product_attention = dispatcher(min_keys, chunk_min_keys)
    if modules:
        host_blas.hold(NAME)
    return bool(modules)


def uninstall(model) -> None:
    """Give the model's mlx-lm modules mlx-lm's own function back."""
    for module in model_modules(model):
        previous = _INSTALLED.pop(module.__name__, None)
        if previous is not None:
            module.scaled_dot_product_attention = previous
    if not _INSTALLED:
        host_blas.let_go(NAME)
