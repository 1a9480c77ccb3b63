"""The stored forms of mlx-lm layer caches, their kinds, and what they weigh.

A layer cache is one of three kinds (`layer_kind`): append-only (rows ``[:n]`` of a
longer cache are the cache at ``n``), state (it cannot be cut back: only a snapshot
taken at that length restores it), or a ``CacheList`` whose parts are classified one
by one. What a state layer becomes is a `LayerState` inside a `StateSnapshot`; what an
append-only layer becomes is a `StoredKV` (or a `StoredList` of them) in an entry.
`CopyCounter` counts what the package copied and shared; `nbytes` and
`kv_bytes_per_token` are the byte figures the cache policy sees.

It knows mlx-lm's cache classes and MLX arrays as values; it takes nothing from a live
cache and builds none (engine.runtime.layer_caches.capture and .restore do).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, CacheList, KVCache, QuantizedKVCache

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
    """Bytes this package copied or shared (as views) so far; pass one in.

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
