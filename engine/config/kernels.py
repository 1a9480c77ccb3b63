"""The kernels branch of the configuration: what engine/kernels installs into the model.

Each operator setting is declared once here, beside its field (engine.config.declare).
It checks its own values; engine/kernels applies them at load.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.declare import label_of, setting

GATED_DELTA_MODES = ("auto", "fast", "ops")
KERNEL_SETS = ("ours", "peers")
# What `--kernels peers` sets: every path of engine/kernels/ off, mlx-lm's and MLX's own
# ops in their place (what every MLX server runs, on every backend).
PEERS_KERNELS = dict(
    sparse=False, gated_delta="ops", dense=False, host_linear=False, cpu_fusion=False
)


@dataclass(frozen=True)
class KernelConfig:
    """Kernels installed into the model at load (engine/kernels/)."""

    sparse: bool = setting(
        True, "DSA short-chunk attention paths (off: mlx-lm's stock path)", name="sparse_kernels"
    )
    sparse_decode_max: int = setting(128, "DSA chunks of 2..N tokens take the decode shape")
    sparse_gather_max: int = setting(512, "DSA chunks up to N tokens take block-gather")
    sparse_block: int = setting(64, "block-gather block size in tokens")
    gated_delta: str = setting(
        "auto",
        "the gated delta recurrence off Metal: the mx.fast primitive or mlx-lm's op loop "
        "(auto: the primitive off Metal, a prefill chunk's in numpy on the CPU)",
        choices=GATED_DELTA_MODES,
    )
    dense: bool = setting(
        True,
        "dense attention on the CPU backend through the host BLAS (off: MLX's fused op)",
        name="dense_kernel",
    )
    dense_min_keys: int = setting(1024, "the host path from N keys (shorter: MLX's)")
    dense_chunk_min_keys: int = setting(
        128, "a chunk of 16 or more queries (a prefill) takes the host path from N keys"
    )
    host_linear: bool = setting(
        True,
        "a prefill chunk's dense layers on the CPU backend through the host BLAS "
        "(off: MLX's matmul)",
    )
    host_linear_min_rows: int = setting(
        16, "the host path from N rows (tokens of all sequences of a forward; fewer: MLX's)"
    )
    gated_delta_host_min_steps: int = setting(
        16,
        "under --gated-delta auto on the CPU, a recurrence of N or more steps (a prefill "
        "chunk) runs in numpy; 0: never",
    )
    cpu_fusion: bool = setting(
        True,
        "RMS norms and a decode step's RoPE compiled into fused ops on the CPU backend, "
        "where MLX's fast ops are compositions (off: MLX's ops)",
    )
    kernels: str = setting(
        "ours",
        "ours: each kernel as its own flag says; peers: every engine kernel off, the "
        "kernels every MLX server runs (--sparse-kernels off --dense-kernel off "
        "--host-linear off --cpu-fusion off --gated-delta ops, whatever those flags say)",
        choices=KERNEL_SETS,
    )

    def __post_init__(self):
        if self.kernels not in KERNEL_SETS:
            raise ValueError(
                f"{label_of(KernelConfig, 'kernels')}: {self.kernels!r} is not one of "
                f"{', '.join(KERNEL_SETS)}"
            )
        if self.kernels == "peers":  # the set wins over the single switches
            for name, value in PEERS_KERNELS.items():
                object.__setattr__(self, name, value)
        if not 1 <= self.sparse_decode_max <= self.sparse_gather_max:
            raise ValueError(
                f"sparse thresholds: need 1 <= {label_of(KernelConfig, 'sparse_decode_max')} "
                f"({self.sparse_decode_max}) <= {label_of(KernelConfig, 'sparse_gather_max')} "
                f"({self.sparse_gather_max})"
            )
        if self.gated_delta not in GATED_DELTA_MODES:
            raise ValueError(
                f"{label_of(KernelConfig, 'gated_delta')}: gated delta {self.gated_delta!r} is "
                f"not one of {', '.join(GATED_DELTA_MODES)}"
            )
        for name, least in (
            ("sparse_block", 1),
            ("dense_min_keys", 1),
            ("dense_chunk_min_keys", 1),
            ("host_linear_min_rows", 1),
            ("gated_delta_host_min_steps", 0),  # 0: never
        ):
            value = getattr(self, name)
            if value < least:
                raise ValueError(
                    f"{label_of(KernelConfig, name)}: {name.replace('_', ' ')} {value} must be "
                    f"at least {least}"
                )
