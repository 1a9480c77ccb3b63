"""A RAM-tier entry as plain numpy arrays for another replica, and back.

A handover moves a stored entry (its append-only rows and every state
snapshot) from the replica that holds it to one that does not, through Ray's
object store. `to_portable` runs on the holder's loop thread and copies
nothing: numpy views over the evaluated MLX buffers (bfloat16 as uint16
bits), laid out with the same structure tree as an entry file
(engine.storage.codec). Ray copies the views into its object store once; on
the same node the receiver reads them without a copy, and `from_portable`
copies them into MLX once. It decides nothing: which entry moves where is the
cache manager's (engine.cache.replicas).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from engine.runtime.tier.ram import StoredEntry
from engine.storage.codec import Encoder, decode_tree, dtype_name


@dataclass(frozen=True)
class PortableEntry:
    """A stored entry as numpy arrays plus the structure that rebuilds it."""

    length: int
    layers: object  # the structure tree of the append-only layers (arrays by index)
    states: tuple  # ((length, structure tree), ...)
    arrays: tuple  # numpy arrays (bfloat16 as uint16)
    dtypes: tuple  # each array's MLX dtype name
    exported_at: float = 0.0  # time.time() when the holder had it ready (handover timing)
    logits: tuple = ()  # ((length, structure tree), ...): the prompt end's log-probabilities
    tokens: np.ndarray | None = None  # int32: the token ids its rows were computed on

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)


def to_portable(entry: StoredEntry) -> PortableEntry:
    """The entry's arrays as numpy views (rows beyond its length left out); no copy, but
    for rows a prefix entry holds (joined into the entry's own buffers first)."""
    entry = entry.whole()
    enc = Encoder()
    layers = enc.tree(list(entry.layers), rows=entry.length)
    states = tuple((n, enc.tree(s)) for n, s in sorted(entry.states.items()))
    logits = tuple((n, enc.tree(a)) for n, a in sorted(entry.logits.items()))
    bits = [a.view(mx.uint16) if a.dtype == mx.bfloat16 else a for a, _ in enc.arrays]
    mx.eval(bits)
    views = []
    for (_, rows), b in zip(enc.arrays, bits):
        view = np.asarray(b)  # zero-copy over the evaluated buffer
        if rows is not None and view.ndim >= 2:
            view = view[..., :rows, :]
        views.append(view)
    dtypes = tuple(dtype_name(a) for a, _ in enc.arrays)
    tokens = entry.tokens[: entry.length] if entry.tokens is not None else None
    return PortableEntry(
        entry.length, layers, states, tuple(views), dtypes, time.time(), logits, tokens
    )


def from_portable(p: PortableEntry) -> StoredEntry:
    """The entry in MLX arrays again (one copy of each array), with the token ids it came
    with (the receiver checks them against its request's before storing it)."""
    arrays = []
    for view, dtype in zip(p.arrays, p.dtypes):
        a = mx.array(view)
        arrays.append(a.view(mx.bfloat16) if dtype == "bfloat16" else a)
    mx.eval(arrays)
    layers = decode_tree(p.layers, arrays)
    states = {int(n): decode_tree(tree, arrays) for n, tree in p.states}
    logits = {int(n): decode_tree(tree, arrays) for n, tree in p.logits}
    return StoredEntry(layers, p.length, states, logits, p.tokens)
