"""The host BLAS on one thread while any host-path kernel is installed.

The host-path kernels (dense_attention, host_linear, gated_delta's host
recurrence) compute on numpy's BLAS
(OpenBLAS) beside MLX's own threads. OpenBLAS's spinning worker threads fight
MLX's on a small CPU (a 4-token attention chunk ran several times slower with
them), and the model loop already runs the prefill worker beside the decode
steps, each on a core: so while any host kernel is installed the BLAS runs on
the calling thread only (threadpoolctl), and its own limits come back when the
last one is uninstalled.

It knows threadpoolctl; nothing of MLX or of the models.
"""

from __future__ import annotations

_holders: set[str] = set()
_limit = None  # threadpoolctl's limiter while any kernel holds it


def hold(kernel: str) -> None:
    """`kernel` computes on the host BLAS from now on: one thread."""
    global _limit
    _holders.add(kernel)
    if _limit is None:
        from threadpoolctl import threadpool_limits

        _limit = threadpool_limits(limits=1, user_api="blas")


def let_go(kernel: str) -> None:
    """`kernel` no longer computes on the host BLAS; the last one gives the limits back."""
    global _limit
    _holders.discard(kernel)
    if not _holders and _limit is not None:
        _limit.restore_original_limits()
        _limit = None


def held() -> frozenset[str]:
    """The kernels that hold the host BLAS to one thread now."""
    return frozenset(_holders)
