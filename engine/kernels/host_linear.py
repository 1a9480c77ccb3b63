"""A prefill chunk's dense layers on the CPU backend through the host BLAS.

MLX's CPU backend multiplies matrices with the reference BLAS its wheel
ships (mlx 0.32 on this x86 CPU): about 5 GFLOP/s, where numpy's OpenBLAS on
one thread does 72-83 (`lineage bench kernels`: 14-35x).
A prefill chunk of the tiny qwen3_next spends most of its time in its
`nn.Linear` layers (the projections and the MLP), so a cold prompt's
prefill ran at MLX's matmul rate: mlx-lm's, mlx-vlm's, ours alike
(docs/architecture.md, "Where prefill and decode time goes, in each
server").

`HostLinear` is `nn.Linear` with one more path: on the CPU device, for an
input of at least `min_rows` rows (tokens of all sequences together) of the
weight's floating dtype, it evaluates the input, takes zero-copy numpy views
of it and of the weight, multiplies on the host BLAS and copies the output
into MLX. numpy has no BLAS for bfloat16 or float16, so those layers are
multiplied in float32: the input and the layer's weight converted by MLX for
the call (one layer's float32 copy at a time, let go after it) and the output
rounded back to the input's dtype (`lineage bench kernels`: a 1024-wide layer
over 256 rows, bfloat16 and float16 12-15x MLX's own). Below `min_rows` (a
decode step: one row per sequence) it is `nn.Linear`: there the step's graph
is evaluated whole and asynchronously (mlx-lm's `async_eval` overlaps the next
step's build with this one's compute), and stopping it at every layer costs
more than MLX's small matmuls (a one-row step 1.5x the time, an eight-row one
0.87-1.2x, a sixteen-row one 0.74x: docs/benchmarks.md, "Host linear"). Inside a
function transformation (`mx.compile`, `vmap`), where nothing may be
evaluated, it is `nn.Linear` too. Mixed dtypes, quantized layers
(`nn.QuantizedLinear`, another class) and any device but the CPU keep MLX's
path. The sums run in another order than MLX's: the outputs agree to rounding,
not bit for bit; whether a chunk takes the path depends only on its own row
count, so one prompt prefilled in the same chunks gives the same numbers every
time.

It is installed by giving the model's `nn.Linear` instances this subclass
(their weights untouched) and uninstalled by giving the class back; the host
BLAS runs on one thread while installed (engine.kernels.host_blas). For
inference only: the host product has no gradient.

It knows mlx's `nn.Linear` and numpy; nothing of the engine.
"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.kernels import host_blas

NAME = "host-linear"
MIN_ROWS = 16  # default: inputs of at least this many rows take the host path
# Calls routed each way since import ("host", "stock"): the tests read it.
ROUTED: Counter = Counter()


DTYPES = (mx.float32, mx.bfloat16, mx.float16)  # float32 on the host; the others converted


class HostLinear(nn.Linear):
    """`nn.Linear` whose products of at least `min_rows` rows run on the host BLAS."""

    min_rows: int = MIN_ROWS  # set per instance by install

    def __call__(self, x: mx.array) -> mx.array:
        weight = self["weight"]
        bias = self["bias"] if "bias" in self else None
        rows = x.size // x.shape[-1] if x.ndim and x.shape[-1] else 0
        if (
            rows < self.min_rows
            or x.dtype not in DTYPES
            or weight.dtype != x.dtype
            or (bias is not None and bias.dtype != x.dtype)
            or mx.default_device() != mx.cpu
        ):
            ROUTED["stock"] += 1
            return nn.Linear.__call__(self, x)
        operands = [x, weight] + ([] if bias is None else [bias])
        if x.dtype != mx.float32:  # numpy's BLAS multiplies float32 only
            operands = [a.astype(mx.float32) for a in operands]
        try:
            mx.eval(operands)
        except (RuntimeError, ValueError):  # inside mx.compile or vmap: nothing is evaluated
            ROUTED["stock"] += 1
            return nn.Linear.__call__(self, x)
        ROUTED["host"] += 1
        a = np.asarray(operands[0]).reshape(rows, x.shape[-1])
        out = a @ np.asarray(operands[1]).T
        if bias is not None:
            out += np.asarray(operands[2])
        y = mx.array(out.reshape(*x.shape[:-1], out.shape[-1]))
        return y if x.dtype == mx.float32 else y.astype(x.dtype)


def install(model, min_rows: int = MIN_ROWS) -> bool:
    """Give the model's `nn.Linear` layers the host path on the CPU; whether any was."""
    if mx.default_device() != mx.cpu:
        return False
    if min_rows < 1:
        raise ValueError(f"min_rows {min_rows} must be positive")
    swapped = 0
    for module in model.modules():
        if type(module) in (nn.Linear, HostLinear):
            module.__class__ = HostLinear
            object.__setattr__(module, "min_rows", min_rows)
            swapped += 1
    if swapped:
        host_blas.hold(NAME)
    return swapped > 0


def uninstall(model) -> None:
    """Give the model's linear layers mlx's class back."""
    for module in model.modules():
        if type(module) is HostLinear:
            module.__class__ = nn.Linear  # its min_rows stays, unread
    host_blas.let_go(NAME)
