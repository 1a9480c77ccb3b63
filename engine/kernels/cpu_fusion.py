"""RMS norms and a decode step's RoPE compiled into fused ops on the CPU backend.

``mx.fast.rms_norm`` and ``mx.fast.rope`` are one kernel each on Metal and
CUDA; on MLX's CPU backend each is its fallback, a composition of a dozen
primitives (square, mean, rsqrt, the broadcasts and multiplies; arange, cos,
sin and slices). On a small model a decode step's time is mostly the
number of primitives it schedules, not their arithmetic: a forward of the
tiny qwen3_next is about 630 of them, 170 of those these two fallbacks'.
Compiled (``mx.compile``), their elementwise chains fuse into one primitive
each: the same forward is about 460, with logits bit for bit the same.

Installed per model instance, never on mlx's classes: each ``nn.RMSNorm``
of the model (and mlx-lm's qwen3_next gated norm, its SiLU gate included)
gets a subclass whose ``__call__`` is the compiled function; each
``nn.RoPE`` one that compiles the rotation of a single position at a batch
cache's per-row offsets (an ``mx.array``), the decode step's shape. Other
shapes (prefill chunks, an integer offset) take MLX's own path: compiling
them would trace once per chunk length and offset. Off the CPU nothing is
installed.

It knows mlx's norm and RoPE modules and mlx-lm's qwen3_next; nothing of the engine.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import precise_swiglu

NAME = "cpu-fusion"


@partial(mx.compile, shapeless=True)
def _rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, weight, eps)


@partial(mx.compile, shapeless=True)
def _rms_norm_gated(x: mx.array, weight: mx.array, gate: mx.array, eps: float) -> mx.array:
    return precise_swiglu(x, gate, mx.fast.rms_norm(x, weight, eps))


@partial(mx.compile)  # traced per shape: the rotation's slices need them
def _rope(x: mx.array, offset: mx.array, dims: int, traditional: bool, base, scale) -> mx.array:
    return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale, offset=offset)


class FusedRMSNorm(nn.RMSNorm):
    def __call__(self, x):
        return _rms_norm(x, self["weight"], self.eps)


class FusedRoPE(nn.RoPE):
    def __call__(self, x, offset=0):
        if isinstance(offset, mx.array) and x.ndim == 4 and x.shape[-2] == 1:
            return _rope(x, offset, self.dims, self.traditional, self.base, self.scale)
        return super().__call__(x, offset)


def _gated_class():
    """mlx-lm's qwen3_next gated norm, and its fused subclass."""
    from mlx_lm.models.qwen3_next import Qwen3NextRMSNormGated

    class FusedRMSNormGated(Qwen3NextRMSNormGated):
        def __call__(self, hidden_states, gate=None):
            if gate is None:
                return super().__call__(hidden_states, gate)
            return _rms_norm_gated(hidden_states, self.weight, gate, self.eps)

    return Qwen3NextRMSNormGated, FusedRMSNormGated


_GATED = _gated_class()
# stock class -> fused subclass; only exact instances of the stock class are swapped
SWAPS = {nn.RMSNorm: FusedRMSNorm, nn.RoPE: FusedRoPE, _GATED[0]: _GATED[1]}
UNSWAPS = {fused: stock for stock, fused in SWAPS.items()}


def install(model) -> bool:
    """Give the model's norms and RoPEs their fused subclasses on the CPU device; whether
    any was."""
    if mx.default_device() != mx.cpu:
        return False
    swapped = 0
    for module in model.modules():
        fused = SWAPS.get(type(module))
        if fused is not None:
            module.__class__ = fused
            swapped += 1
    return swapped > 0


def uninstall(model) -> None:
    """Give the model's norms and RoPEs mlx's classes back."""
    for module in model.modules():
        stock = UNSWAPS.get(type(module))
        if stock is not None:
            module.__class__ = stock
