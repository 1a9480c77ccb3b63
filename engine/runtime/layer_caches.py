"""State snapshots, stored entries and zero-copy restores of mlx-lm layer caches.

The contract (docs/architecture.md, "The cache contract"):

- Append-only layers (``KVCache``, ``QuantizedKVCache``, ``BatchKVCache`` and
  such parts of a ``CacheList``): rows ``[:n]`` of a longer cache are the cache
  at ``n`` tokens. An entry keeps a finished sequence's extracted arrays as
  they are (new array objects over the same buffers: no copy), and a restore
  hands out views ``keys[..., :n, :]`` of them (no copy).
- State layers (``ArraysCache``, ``RotatingKVCache``, ``BatchRotatingKVCache``
  and every kind this module does not know, subclasses included): they cannot
  be cut back to an earlier token. A snapshot copies their arrays (small, and
  independent of the prompt length) and evaluates them, so it pins neither a
  batch buffer nor a lazy graph. Unknown kinds are copied whole.
- Why sharing is safe: MLX arrays are immutable once evaluated; a cache's
  in-place slice update is copy-on-write while another array object shares the
  buffer, and ``KVCache.update_and_fetch`` concatenates when its buffer is
  full. Every restored cache holds array objects of its own, so its writes
  never reach the entry or the snapshot, and nothing written to the cache an
  entry came from reaches the entry.
- The one KV copy of a warm turn is the batch merge (engine.runtime.batching),
  outside this module; ``CopyCounter`` records what this module copies and
  shares.
- Segments: an entry that reads its first rows from another holds only the rows
  after them (``split_rows`` copies those into buffers of its own); a restore takes
  views of each segment (``restore(..., prefix=)``) and the merge writes each in
  place; ``join_rows`` makes one buffer of them where one is needed (a file, a
  peer, an entry whose prefix entry leaves). ``pack_rows`` keeps stored rows
  quantized; a restore dequantizes them lazily.

This module knows mlx-lm's cache classes and MLX arrays. It knows nothing
about tokens, lineages, budgets, or when a snapshot should be taken.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

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

APPEND, STATE, LIST = "append", "state", "list"

# Exact types: a subclass may break the append-only rule, so it counts as
# unknown and is snapshotted whole.
_APPEND_TYPES = (KVCache, QuantizedKVCache, BatchKVCache)


def layer_kind(cache: Any) -> str:
    """The kind of a layer cache: "append" (rows [:n] are the cache at n),
    "list" (a CacheList: classify its parts) or "state" (everything else)."""
    kind = type(cache)
    if kind in _APPEND_TYPES or isinstance(cache, BatchKVCache):  # the engine's batch kind too
        return APPEND
    if kind is CacheList:
        return LIST
    return STATE


# --- stored forms -----------------------------------------------------------


@dataclass
class CopyCounter:
    """Bytes this module copied or shared (as views) so far; pass one in.

    ``copied_kv`` stays 0 by construction: KV is only ever viewed (an unknown
    kind copied whole counts as state). It is kept so a benchmark can show it.
    """

    copied_kv: int = 0
    copied_state: int = 0
    shared_kv: int = 0
    shared_state: int = 0


@dataclass(frozen=True, eq=False)
class ArraysState:
    """An ArraysCache's arrays (conv window, recurrent state), batch dim 1."""

    arrays: tuple  # mx.array or None per slot

    @property
    def nbytes(self) -> int:
        return nbytes(self.arrays)


@dataclass(frozen=True, eq=False)
class WindowState:
    """A RotatingKVCache in temporal order, at most ``max_size`` rows."""

    keys: Optional[mx.array]
    values: Optional[mx.array]
    offset: int
    max_size: int
    keep: int

    @property
    def nbytes(self) -> int:
        return nbytes((self.keys, self.values))


@dataclass(frozen=True, eq=False)
class OpaqueState:
    """An unknown cache kind: its whole ``state`` (arrays copied) and meta."""

    cls: type
    state: Any
    meta_state: Any = None

    @property
    def nbytes(self) -> int:
        return nbytes(self.state)


@dataclass(frozen=True, eq=False)
class ListState:
    """A CacheList's parts: a state per state part, None per append-only part."""

    parts: tuple

    @property
    def nbytes(self) -> int:
        return nbytes(self.parts)


LayerState = Union[ArraysState, WindowState, OpaqueState, ListState]


@dataclass(frozen=True, eq=False)
class StateSnapshot:
    """The state layers of one sequence at one length; None per append layer.

    ``length`` is the token count where some layer records it (KV or window
    offset), else None (a pure recurrent model does not know its length).
    """

    layers: tuple  # LayerState or None per model layer
    length: Optional[int]

    @property
    def nbytes(self) -> int:
        return nbytes(self.layers)

    @property
    def holds_state(self) -> bool:
        """Whether any layer is a state layer (else any length restores)."""
        return any(_holds_state(layer) for layer in self.layers)


def _holds_state(layer: Any) -> bool:
    if isinstance(layer, ListState):
        return any(_holds_state(p) for p in layer.parts)
    return layer is not None


@dataclass(frozen=True, eq=False)
class StoredKV:
    """An append-only layer of an entry: ``length`` rows, shared, never copied.

    ``keys``/``values`` are arrays, or (packed, scales, biases) tuples when
    ``quant`` is (group_size, bits) of a QuantizedKVCache (the model's own cache is
    quantized) or ``packed`` is (group_size, bits) of rows the tier keeps quantized
    (``pack_rows``) and a restore dequantizes into the model's dtype.
    """

    keys: Any
    values: Any
    length: int
    quant: Optional[tuple] = None
    packed: Optional[tuple] = None

    @property
    def nbytes(self) -> int:
        return nbytes((self.keys, self.values))

    @property
    def bytes_per_token(self) -> int:
        return self.nbytes // self.length if self.length else 0


@dataclass(frozen=True, eq=False)
class StoredList:
    """A CacheList layer of an entry: StoredKV per append part, else None."""

    parts: tuple

    @property
    def nbytes(self) -> int:
        return nbytes(self.parts)

    @property
    def bytes_per_token(self) -> int:
        return sum(p.bytes_per_token for p in self.parts if p is not None)


EntryLayer = Optional[Union[StoredKV, StoredList]]


# --- accounting ---------------------------------------------------------------


def _arrays(obj: Any) -> Iterator[mx.array]:
    """Every mx.array inside obj (nested tuples, lists, dicts, our dataclasses)."""
    if isinstance(obj, mx.array):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _arrays(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _arrays(item)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from _arrays(getattr(obj, field.name))


def arrays_of(obj: Any) -> list:
    """Every mx.array inside obj, as a list (to evaluate them)."""
    return list(_arrays(obj))


def nbytes(obj: Any) -> int:
    """Bytes of the arrays obj holds; a view counts its visible rows only."""
    return sum(a.nbytes for a in _arrays(obj))


def kv_bytes_per_token(layers: Sequence[EntryLayer]) -> int:
    """KV bytes one token costs across an entry's append-only layers."""
    return sum(layer.bytes_per_token for layer in layers if layer is not None)


def entry_length(layers: Sequence[EntryLayer]) -> Optional[int]:
    """The token count of an entry's KV rows (None for a pure state model)."""
    for layer in layers:
        parts = layer.parts if isinstance(layer, StoredList) else (layer,)
        for part in parts:
            if part is not None:
                return part.length
    return None


# --- snapshots ----------------------------------------------------------------


def _copy(x: Optional[mx.array], counter: CopyCounter) -> Optional[mx.array]:
    # mx.array(x) is a lazy copy into a new buffer (a slice would share, and a
    # batch row would pin the whole batch's buffer).
    if x is None:
        return None
    counter.copied_state += x.nbytes
    return mx.array(x)


def _share(x: Any) -> Any:
    """A new array object over the same buffer (a view, no copy); a stored form that
    packs an array (engine.runtime.packed_state) gives its array back, unpacked."""
    if isinstance(x, mx.array):
        return x[...]
    unpack = getattr(x, "unpack", None)
    return unpack() if unpack is not None else x


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
    mx.eval(list(_arrays(snapshot)))
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


# --- entries ------------------------------------------------------------------


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
    mx.eval(list(_arrays(layers)))
    return layers, snapshot_state_single(extracted, counter)


# --- restore ------------------------------------------------------------------


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
        _unpacked(layer, tree_map(lambda a, r=rows: a[..., :r, :], (layer.keys, layer.values)))
        for layer, rows in segments
        if rows > 0 and layer.keys is not None
    ]
    n = sum(rows for _, rows in segments)
    if len(parts) == 1:
        cache.keys, cache.values = parts[0]
    elif parts:
        cache.keys, cache.values = (_join([kv[i] for kv in parts]) for i in (0, 1))
        if first.quant is None:
            cache.segments = tuple(parts)  # read by the batch merge (engine.runtime.batching)
    counter.shared_kv += nbytes(parts)
    cache.offset = n
    return cache


def _unpacked(layer: StoredKV, kv: tuple) -> tuple:
    """(keys, values) rows of `layer` as the model reads them: dequantized (lazily) when
    the tier keeps them packed."""
    if layer.packed is None:
        return kv
    group, bits = layer.packed
    return tuple(mx.dequantize(*x, group_size=group, bits=bits) for x in kv)


def _as_read(layer: StoredKV) -> StoredKV:
    """`layer` with its rows as the model reads them (dequantized when packed)."""
    if layer.packed is None:
        return layer
    keys, values = _unpacked(layer, (layer.keys, layer.values))
    return StoredKV(keys, values, layer.length, layer.quant)


def pack_rows(layers: Sequence[EntryLayer], precision: str) -> tuple:
    """An entry's append-only layers with their rows quantized (``precision`` "int8" or
    "int4": groupwise, ``mx.quantize``, 64 values a group, 32 where a row is narrower),
    in buffers of their own (evaluated); as they are when "exact", already quantized,
    or a row's width has no such group."""
    if precision == "exact":
        return tuple(layers)
    bits = {"int8": 8, "int4": 4}[precision]

    def pack(layer: EntryLayer) -> EntryLayer:
        if isinstance(layer, StoredList):
            return StoredList(tuple(pack(p) for p in layer.parts))
        if layer is None or layer.keys is None or layer.quant or layer.packed:
            return layer
        width = min(layer.keys.shape[-1], layer.values.shape[-1])
        group = next((g for g in (64, 32) if width % g == 0), None)
        if group is None:
            return layer
        keys, values = (
            tuple(mx.quantize(a, group_size=group, bits=bits)) for a in (layer.keys, layer.values)
        )
        return StoredKV(keys, values, layer.length, None, (group, bits))

    out = tuple(pack(layer) for layer in layers)
    mx.eval(list(_arrays(out)))
    return out


def _join(pieces: list) -> Any:
    """Arrays (or quantized (packed, scales, biases) tuples) joined along the token axis;
    lazy: nothing is copied unless the result is evaluated."""
    if isinstance(pieces[0], tuple):
        return tuple(mx.concatenate(list(p), axis=-2) for p in zip(*pieces))
    return mx.concatenate(pieces, axis=-2)


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
    or the snapshot (copy-on-write, see the module docstring). The list can go
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


def split_rows(
    layers: Sequence[EntryLayer], start: int, counter: Optional[CopyCounter] = None
) -> tuple:
    """An entry's append-only layers without their first ``start`` rows: rows
    ``[start:]`` copied into buffers of their own (evaluated), so the buffer they came
    from is not held; what an entry stores when another entry holds its first rows."""
    counter = counter if counter is not None else CopyCounter()

    def cut(layer: EntryLayer) -> EntryLayer:
        if isinstance(layer, StoredList):
            return StoredList(tuple(cut(p) for p in layer.parts))
        if layer is None:
            return None
        if start > layer.length:
            raise ValueError(f"split at {start} beyond stored KV length {layer.length}")
        if layer.keys is None:
            return StoredKV(None, None, 0, layer.quant)
        keys, values = tree_map(lambda a: mx.array(a[..., start:, :]), (layer.keys, layer.values))
        out = StoredKV(keys, values, layer.length - start, layer.quant, layer.packed)
        counter.copied_kv += out.nbytes
        return out

    out = tuple(cut(layer) for layer in layers)
    mx.eval(list(_arrays(out)))
    return out


def join_rows(segments: Sequence[tuple[Sequence[EntryLayer], int]]) -> tuple:
    """One entry's append-only layers from its segments ((layers, rows) pairs, in token
    order): each layer's rows in one buffer of its own (evaluated); what a file or a
    peer gets of an entry that reads its prefix from another, and what such an entry
    keeps once that other entry is gone."""
    if len(segments) == 1 and segments[0][1] == entry_length(segments[0][0]):
        return tuple(segments[0][0])

    def join(parts: list) -> EntryLayer:
        layer = parts[0][0]
        if isinstance(layer, StoredList):
            return StoredList(
                tuple(join([(p.parts[i], r) for p, r in parts]) for i in range(len(layer.parts)))
            )
        if layer is None:
            return None
        rows = sum(r for _, r in parts)
        kept = [(p, r) for p, r in parts if r > 0 and p.keys is not None]
        if not kept:
            return StoredKV(None, None, 0, layer.quant, layer.packed)
        if len({p.packed for p, _ in kept}) > 1:  # packed and not: joined as the model reads
            kept = [(_as_read(p), r) for p, r in kept]

        def cat(get):
            return _join([tree_map(lambda a, r=r: a[..., :r, :], get(p)) for p, r in kept])

        first = kept[0][0]
        keys, values = cat(lambda p: p.keys), cat(lambda p: p.values)
        return StoredKV(keys, values, rows, first.quant, first.packed)

    count = len(segments[0][0])
    out = tuple(join([(layers[i], r) for layers, r in segments]) for i in range(count))
    mx.eval(list(_arrays(out)))
    return out
