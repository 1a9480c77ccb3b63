"""An entry's stored rows: packed, split at a prefix, joined into one buffer.

`pack_rows` keeps an entry's append-only rows quantized (a restore dequantizes them
lazily, `unpacked`); `split_rows` copies the rows after a prefix another entry holds
into buffers of their own; `join_rows` makes one buffer of an entry's segments where
one is needed (a file, a peer, an entry whose prefix entry leaves).

It knows the stored forms (engine.runtime.layer_caches.forms) and MLX's quantization;
it knows no live cache and nothing about which entry reads its rows from which.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import mlx.core as mx
from mlx.utils import tree_map

from engine.runtime.layer_caches.forms import (
    CopyCounter,
    EntryLayer,
    StoredKV,
    StoredList,
    arrays_of,
    entry_length,
)


def unpacked(layer: StoredKV, kv: tuple) -> tuple:
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
    keys, values = unpacked(layer, (layer.keys, layer.values))
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
    mx.eval(arrays_of(out))
    return out


def join_pieces(pieces: list) -> Any:
    """Arrays (or quantized (packed, scales, biases) tuples) joined along the token axis;
    lazy: nothing is copied unless the result is evaluated."""
    if isinstance(pieces[0], tuple):
        return tuple(mx.concatenate(list(p), axis=-2) for p in zip(*pieces))
    return mx.concatenate(pieces, axis=-2)


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
    mx.eval(arrays_of(out))
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
            pieces = [tree_map(lambda a, r=r: a[..., :r, :], get(p)) for p, r in kept]
            if len(pieces) == 1:  # a lone piece: concatenate would hand back a view of it
                return tree_map(mx.array, pieces[0])
            return join_pieces(pieces)

        first = kept[0][0]
        keys, values = cat(lambda p: p.keys), cat(lambda p: p.values)
        return StoredKV(keys, values, rows, first.quant, first.packed)

    count = len(segments[0][0])
    out = tuple(join([(layers[i], r) for layers, r in segments]) for i in range(count))
    mx.eval(arrays_of(out))
    return out
