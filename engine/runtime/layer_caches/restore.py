"""Zero-copy restores: fresh layer caches at a length, over an entry and a snapshot.

`restore` hands out views ``keys[..., :n, :]`` of an entry's append-only rows (after
those of the segments that hold its first rows) and new cache objects over a
snapshot's state arrays; nothing is copied, and writes into the result never reach
the entry or the snapshot (the package's index says why).

It knows mlx-lm's cache classes and the stored forms; it knows nothing about which
restore point to take, nor how the batch merges what it hands out
(engine.runtime.batching).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, QuantizedKVCache, RotatingKVCache

from engine.runtime.layer_caches.forms import (
    ArraysState,
    CopyCounter,
    EntryLayer,
    LayerState,
    ListState,
    OpaqueState,
    StateSnapshot,
    StoredKV,
    StoredList,
    WindowState,
    nbytes,
)
from engine.runtime.layer_caches.rows import join_pieces, unpacked


def _share(x: Any) -> Any:
    """A new array object over the same buffer (a view, no copy); a stored form that
    packs an array (engine.runtime.packed_state) gives its array back, unpacked."""
    if isinstance(x, mx.array):
        return x[...]
    unpack = getattr(x, "unpack", None)
    return unpack() if unpack is not None else x


def _restore_kv(segments: Sequence[tuple[StoredKV, int]], counter: CopyCounter) -> Any:
    """A KVCache over `segments` ((stored layer, rows) pairs, in token order): views of
    each segment's first rows. Rows from several segments (an entry that reads its
    prefix from the entry it was restored from) are joined lazily: `keys` is their
    concatenation, evaluated only if something reads it, and `segments` holds the
    views, so the batch merge writes each into place without the join's copy."""
    first = segments[0][0]
    for layer, rows in segments:
        if rows > layer.length:
            raise ValueError(f"restore length {rows} beyond stored KV length {layer.length}")
    if first.quant is None:
        cache = KVCache()
    else:
        cache = QuantizedKVCache(group_size=first.quant[0], bits=first.quant[1])
    parts = [
        unpacked(layer, tree_map(lambda a, r=rows: a[..., :r, :], (layer.keys, layer.values)))
        for layer, rows in segments
        if rows > 0 and layer.keys is not None
    ]
    n = sum(rows for _, rows in segments)
    if len(parts) == 1:
        cache.keys, cache.values = parts[0]
    elif parts:
        cache.keys, cache.values = (join_pieces([kv[i] for kv in parts]) for i in (0, 1))
        if first.quant is None:
            cache.segments = tuple(parts)  # read by the batch merge (engine.runtime.batching)
    counter.shared_kv += nbytes(parts)
    cache.offset = n
    return cache


def _restore_state(state: LayerState, n: int, counter: CopyCounter) -> Any:
    counter.shared_state += state.nbytes
    if isinstance(state, ArraysState):
        cache = ArraysCache(len(state.arrays))
        cache.cache = [_share(a) for a in state.arrays]
        if any(hasattr(a, "unpack") for a in state.arrays):
            # The stored (packed) forms, for the batch merge: it joins them before it
            # unpacks (engine.runtime.batching); `cache` is their lazy unpacking.
            cache.packed = tuple(state.arrays)
        return cache
    if isinstance(state, WindowState):
        if state.offset != n:
            raise ValueError(f"window snapshot at {state.offset}, restore asked {n}")
        cache = RotatingKVCache(max_size=state.max_size, keep=state.keep)
        cache.keys, cache.values = _share(state.keys), _share(state.values)
        cache.offset = state.offset
        cache._idx = 0 if state.keys is None else state.keys.shape[2]
        return cache
    if isinstance(state, OpaqueState):
        cache = state.cls.__new__(state.cls)
        cache.state = tree_map(_share, state.state)
        if state.meta_state is not None:
            cache.meta_state = state.meta_state
        return cache
    raise ValueError(f"not a layer state: {type(state).__name__}")


def _restore_layer(segments: list, state: Any, counter: CopyCounter):
    """One layer's cache from its stored form in each segment ((layer, rows) pairs)."""
    layer = segments[0][0]
    if isinstance(layer, StoredList):
        if not isinstance(state, ListState) or len(state.parts) != len(layer.parts):
            raise ValueError("a CacheList entry layer needs a matching ListState")
        parts = []
        for i, s in enumerate(state.parts):
            parts.append(_restore_layer([(seg.parts[i], r) for seg, r in segments], s, counter))
        return CacheList(*parts)
    if isinstance(layer, StoredKV):
        if state is not None:
            raise ValueError("an append-only layer has a state snapshot")
        return _restore_kv(segments, counter)
    if state is None:
        raise ValueError("a state layer has neither stored KV nor a snapshot")
    return _restore_state(state, sum(r for _, r in segments), counter)


def restore(
    entry_layers: Sequence[EntryLayer],
    state: StateSnapshot,
    n: int,
    counter: Optional[CopyCounter] = None,
    prefix: Sequence[tuple[Sequence[EntryLayer], int]] = (),
) -> list:
    """Fresh single-sequence layer caches at length ``n``; copies nothing.

    Append-only layers are views ``[..., :rows, :]`` of the entry's arrays, after
    those of ``prefix``: (layers, rows) segments that hold the first rows (an entry
    that reads its prefix from another), so ``entry_layers`` serve the last
    ``n - sum(rows)``. State layers are new cache objects over ``state``'s arrays,
    which must have been taken at ``n``. Writes into the result never reach the entry
    or the snapshot (copy-on-write, see the package's index). The list can go
    straight to ``BatchGenerator.insert(caches=...)`` for kinds mlx-lm batches.
    """
    if len(entry_layers) != len(state.layers):
        raise ValueError(f"entry has {len(entry_layers)} layers, snapshot {len(state.layers)}")
    # A model without state layers restores anywhere from any snapshot.
    if n < 0 or (state.holds_state and state.length not in (None, n)):
        raise ValueError(f"snapshot taken at {state.length}, restore asked {n}")
    own = n - sum(rows for _, rows in prefix)
    if own < 0:
        raise ValueError(f"restore length {n} within the prefix's {n - own} rows")
    counter = counter if counter is not None else CopyCounter()
    segments = [*prefix, (entry_layers, own)]
    return [
        _restore_layer([(layers[i], rows) for layers, rows in segments], s, counter)
        for i, s in enumerate(state.layers)
    ]
