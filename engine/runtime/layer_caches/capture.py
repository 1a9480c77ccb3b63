"""Taking a sequence's layer caches: state snapshots and stored entries.

`snapshot_state` copies the state layers of one sequence of a batch (or of a
single-sequence cache list, `snapshot_state_single`) and evaluates the copies, so a
snapshot pins neither a batch buffer nor a lazy graph; KV is not touched.
`store_entry` splits a finished sequence's extracted cache into its append-only layers,
kept as views over the extraction's buffers (no copy), and the state at its length.

It knows mlx-lm's cache classes and how each records its rows and its length; it
knows nothing about when a snapshot is due, nor how one is restored
(engine.runtime.layer_caches.restore).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

from engine.runtime.layer_caches.forms import (
    APPEND,
    LIST,
    STATE,
    ArraysState,
    CopyCounter,
    EntryLayer,
    ListState,
    OpaqueState,
    StateSnapshot,
    StoredKV,
    StoredList,
    WindowState,
    arrays_of,
    layer_kind,
)


def _copy(x: Optional[mx.array], counter: CopyCounter) -> Optional[mx.array]:
    # mx.array(x) is a lazy copy into a new buffer (a slice would share, and a
    # batch row would pin the whole batch's buffer).
    if x is None:
        return None
    counter.copied_state += x.nbytes
    return mx.array(x)


def _window_state(c: RotatingKVCache, counter: CopyCounter) -> WindowState:
    if c.keys is None:
        return WindowState(None, None, c.offset, c.max_size, c.keep)
    # mlx-lm's own layout helpers: temporal order, then at most max_size rows
    # (a multi-token update leaves max_size - 1 + S rows; the next update
    # trims to the same max_size - 1 either way, so the window is unchanged).
    keys, values = c._temporal_order(c.keys), c._temporal_order(c.values)
    extra = keys.shape[2] - c.max_size
    if extra > 0:
        keys, values = c._trim(extra, keys), c._trim(extra, values)
    return WindowState(_copy(keys, counter), _copy(values, counter), c.offset, c.max_size, c.keep)


def _rows(a: Optional[mx.array], idx: Optional[int]) -> Optional[mx.array]:
    if a is None or idx is None:
        return a
    if not 0 <= idx < a.shape[0]:
        raise ValueError(f"sequence index {idx} out of range for batch {a.shape[0]}")
    return a[idx : idx + 1]


def _snapshot_layer(c: Any, idx: Optional[int], counter: CopyCounter):
    kind = layer_kind(c)
    if kind == APPEND:
        return None
    if kind == LIST:
        return ListState(tuple(_snapshot_layer(p, idx, counter) for p in c.caches))
    if type(c) is ArraysCache:
        return ArraysState(tuple(_copy(_rows(a, idx), counter) for a in c.cache))
    if type(c) is RotatingKVCache:
        return _window_state(c, counter)
    if type(c) is BatchRotatingKVCache:
        idx = 0 if idx is None else idx
        if c.keys is None:
            return WindowState(None, None, int(c.offset[idx].item()), c.max_size, 0)
        return _window_state(c.extract(idx), counter)
    # Unknown kind: its sequence (via extract, where it batches) copied whole.
    if idx is not None and hasattr(c, "extract"):
        c = c.extract(idx)
    state = tree_map(lambda x: _copy(x, counter) if isinstance(x, mx.array) else x, c.state)
    return OpaqueState(type(c), state, getattr(c, "meta_state", None))


def _length(c: Any, idx: Optional[int]) -> Optional[int]:
    """The token count a layer records for sequence idx, if it records one."""
    if type(c) is CacheList:
        for part in c.caches:
            if (n := _length(part, idx)) is not None:
                return n
        return None
    if type(c) in (KVCache, QuantizedKVCache, RotatingKVCache):
        return int(c.offset)
    if isinstance(c, (BatchKVCache, BatchRotatingKVCache)):
        return int(c.offset[0 if idx is None else idx].item())
    return None


def _snapshot(caches: Sequence[Any], idx: Optional[int], counter) -> StateSnapshot:
    counter = counter if counter is not None else CopyCounter()
    layers = tuple(_snapshot_layer(c, idx, counter) for c in caches)
    length = next((n for c in caches if (n := _length(c, idx)) is not None), None)
    snapshot = StateSnapshot(layers, length)
    # Evaluate now: a lazy copy would keep the batch arrays alive.
    mx.eval(arrays_of(snapshot))
    return snapshot


def snapshot_state(
    batch_caches: Sequence[Any], idx: int, counter: Optional[CopyCounter] = None
) -> StateSnapshot:
    """Copy the state layers of sequence ``idx`` of a batch; KV is not touched.

    ``batch_caches`` are a BatchGenerator batch's layer caches after a prompt
    step returned (padding finalized). The snapshot's bytes are state only.
    """
    return _snapshot(batch_caches, idx, counter)


def snapshot_state_single(
    caches: Sequence[Any], counter: Optional[CopyCounter] = None
) -> StateSnapshot:
    """Copy the state layers of a single-sequence cache list; KV is not touched."""
    return _snapshot(caches, None, counter)


def _store_layer(c: Any, counter: CopyCounter) -> EntryLayer:
    kind = layer_kind(c)
    if kind == LIST:
        return StoredList(tuple(_store_layer(p, counter) for p in c.caches))
    if kind == STATE:
        return None
    if isinstance(c, BatchKVCache):
        raise ValueError("store_entry takes an extracted (single-sequence) cache")
    n = int(c.offset)
    if c.keys is None:
        return StoredKV(None, None, 0)
    # Own array objects over the extracted buffers: the cache the entry came
    # from may still be written in place, which must not reach the entry.
    keys, values = tree_map(lambda a: a[..., :n, :], (c.keys, c.values))
    quant = (c.group_size, c.bits) if type(c) is QuantizedKVCache else None
    layer = StoredKV(keys, values, n, quant)
    counter.shared_kv += layer.nbytes
    return layer


def store_entry(
    extracted: Sequence[Any], counter: Optional[CopyCounter] = None
) -> tuple[tuple, StateSnapshot]:
    """Split a finished sequence's extracted cache into (entry layers, state).

    Append-only layers are kept as they are (views over the extraction's
    buffers, zero copy); state layers are copied into the snapshot at the
    entry's length. Everything is evaluated before returning. A
    ``BatchKVCache.extract`` has no spare rows; a single-sequence KVCache's
    spare capacity stays pinned by the views but is not counted in nbytes.
    """
    counter = counter if counter is not None else CopyCounter()
    layers = tuple(_store_layer(c, counter) for c in extracted)
    mx.eval(arrays_of(layers))
    return layers, snapshot_state_single(extracted, counter)
