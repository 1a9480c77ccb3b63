"""Kernels the engine installs into an mlx-lm model at load.

Each kernel replaces one computation of an mlx-lm model with a faster
equivalent, installed on the loaded model (never by copying mlx-lm's model
files) and switchable off, so the stock path stays one setting away:

- ``sparse_attention``: DSA attention (deepseek_v32, glm_moe_dsa) for chunks
  of 2 to ``gather_max`` tokens: the decode shape and block-gather.
- ``gated_delta``: the gated delta recurrence off Metal, dispatched to
  ``mx.fast.gated_delta_update`` off Metal, and a prefill chunk's on the
  host (numpy) on the CPU.
- ``dense_attention``: dense attention (every model calling mlx-lm's
  ``scaled_dot_product_attention``) on the CPU backend at long contexts,
  through the host BLAS instead of MLX's CPU ops.
- ``host_linear``: a prefill chunk's dense layers (``nn.Linear``) on the CPU
  backend through the host BLAS, where MLX's matmul is slow.
- ``cpu_fusion``: RMS norms and a decode step's RoPE compiled into fused ops
  on the CPU backend, where ``mx.fast``'s are compositions of primitives.

This package knows MLX and mlx-lm's model modules; it knows nothing of the
engine's configuration (the runtime passes plain values), caches policy,
actors or serving.
"""

from __future__ import annotations

from engine.kernels import (
    cpu_fusion,
    dense_attention,
    gated_delta,
    host_linear,
    sparse_attention,
)
from engine.kernels.sparse_attention import SparseRouting


def install(
    model,
    sparse: SparseRouting | None,
    gated_delta_mode: str = "auto",
    dense_min_keys: int | None = None,
    dense_chunk_min_keys: int | None = None,
    cpu_fusion_on: bool = False,
    host_linear_min_rows: int | None = None,
    gated_delta_host_min_steps: int | None = None,
) -> tuple[str, ...]:
    """Install the kernels that apply to `model`; returns the names of those now active.

    `sparse` None leaves DSA attention on mlx-lm's path; `dense_min_keys` None
    leaves dense attention on MLX's, else the host path takes it from that many keys
    (a chunk of queries from `dense_chunk_min_keys`, None: the same);
    `cpu_fusion_on` fuses the norms and the decode RoPE on the CPU;
    `host_linear_min_rows` None leaves the dense layers on MLX's matmul, else the host
    path takes inputs of that many rows; `gated_delta_host_min_steps` None leaves the
    recurrence on the primitive, else (``auto``, CPU) calls of that many steps run on
    the host.
    """
    active = []
    if sparse is not None and sparse_attention.install(model, sparse):
        active += [sparse_attention.DECODE_SHAPE, sparse_attention.BLOCK_GATHER]
    if gated_delta.install(model, gated_delta_mode, gated_delta_host_min_steps):
        active.append(gated_delta.FAST)
        if gated_delta.host_active():
            active.append(gated_delta.HOST)
    if dense_min_keys is not None and dense_attention.install(
        model, dense_min_keys, dense_chunk_min_keys
    ):
        active.append(dense_attention.NAME)
    if cpu_fusion_on and cpu_fusion.install(model):
        active.append(cpu_fusion.NAME)
    if host_linear_min_rows is not None and host_linear.install(model, host_linear_min_rows):
        active.append(host_linear.NAME)
    return tuple(active)


def uninstall(model) -> None:
    """Put mlx-lm's own paths back on `model`."""
    sparse_attention.uninstall(model)
    gated_delta.uninstall(model)
    dense_attention.uninstall(model)
    cpu_fusion.uninstall(model)
    host_linear.uninstall(model)
