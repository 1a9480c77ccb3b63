"""Token arrays: validation and the longest common prefix, with numpy."""

from __future__ import annotations

import numpy as np


def as_tokens(tokens, what: str = "tokens") -> np.ndarray:
    """A non-empty 1-D int32 array of token ids; ValueError naming `what` otherwise."""
    array = np.asarray(tokens)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(
            f"{what} must be a non-empty 1-D array of token ids, got shape {array.shape}"
        )
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{what} must hold integer token ids, got dtype {array.dtype}")
    return array.astype(np.int32, copy=False)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays (one vectorized compare)."""
    n = min(len(a), len(b))
    differs = a[:n] != b[:n]
    first = int(differs.argmax()) if n else 0
    return first if n and differs[first] else n
