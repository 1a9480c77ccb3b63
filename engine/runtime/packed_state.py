"""Checkpoints kept at reduced precision: recurrent states packed, unpacked on restore.

A state snapshot's float32 arrays (Gated DeltaNet, KDA and Mamba2 recurrent
states: nearly all of a checkpoint's bytes) are stored as a `PackedArray`:
- "float16": the array rounded to float16 (half the bytes, eight times bfloat16's
  precision: 10 mantissa bits against 7) when its magnitudes fit well inside float16's
  range, else over a float32 scale per row of its last axis (4 bytes a row more, no
  overflow);
- "bfloat16": the array rounded to bfloat16 (half the bytes);
- "int8": groupwise 8-bit (`mx.quantize`, groups of `GROUP` along the last axis, a
  bfloat16 scale and bias per group: about 0.27 of the float32 bytes).
Every other array (conv windows, rotating windows: already in the weights' dtype)
is kept as it is, and "exact" keeps the snapshot untouched, bit for bit.
A restore unpacks into a fresh float32 array (`PackedArray.unpack`, lazy: the
batch merge evaluates it), which engine.runtime.layer_caches calls on any stored
array that has one, so it never imports this module.

It knows MLX arrays and the stored forms of engine.runtime.layer_caches; nothing
about tokens, tiers or when a checkpoint is taken.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import mlx.core as mx

from engine.config.cache import CHECKPOINT_PRECISIONS as PRECISIONS

GROUP = 64  # mx.quantize's group size along the last axis
# A state whose magnitudes stay below this is cast to float16 as it is (a restore is one
# cast, as bfloat16's); a larger one is kept over per-row scales (no overflow).
FLOAT16_PLAIN = 2.0**14


@dataclass(frozen=True, eq=False)
class PackedArray:
    """A float32 array stored at reduced precision: `data` (bfloat16, or the packed 8-bit
    words), and for "int8" the per-group `scales` and `biases`."""

    precision: str
    data: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.data, self.scales, self.biases) if a is not None)

    def unpack(self) -> mx.array:
        """The float32 array (lazy): a fresh buffer, the stored one untouched."""
        if self.precision == "float16":
            if self.scales is None:
                return self.data.astype(mx.float32)
            return _scaled(self.data, self.scales)
        if self.precision == "int8":
            a = mx.dequantize(self.data, self.scales, self.biases, group_size=GROUP, bits=8)
            return a.astype(mx.float32)
        return self.data.astype(mx.float32)


@mx.compile
def _scaled(data: mx.array, scales: mx.array) -> mx.array:
    """float16 rows times their float32 scales, as float32: compiled, so the cast and the
    product are one pass over the state (two passes uncompiled: 2.4x an exact restore's
    state merge, against ~1x compiled)."""
    return data.astype(mx.float32) * scales


def pack_array(a: mx.array, precision: str) -> mx.array | PackedArray:
    """`a` at `precision`; returned as it is when exact, not float32, or not groupable."""
    if precision == "exact" or not isinstance(a, mx.array) or a.dtype != mx.float32:
        return a  # already packed, a window in the weights' dtype, or kept exact
    if precision == "float16":
        if mx.max(mx.abs(a)).item() <= FLOAT16_PLAIN:  # in range: the cast alone
            return PackedArray(precision, a.astype(mx.float16))
        scales = mx.max(mx.abs(a), axis=-1, keepdims=True)
        scales = mx.where(scales > 0, scales, mx.ones_like(scales))
        return PackedArray(precision, (a / scales).astype(mx.float16), scales)
    if precision == "bfloat16":
        return PackedArray(precision, a.astype(mx.bfloat16))
    if precision == "int8":
        if a.ndim < 2 or a.shape[-1] % GROUP:
            return PackedArray("bfloat16", a.astype(mx.bfloat16))
        data, scales, biases = mx.quantize(a.astype(mx.bfloat16), group_size=GROUP, bits=8)
        return PackedArray(precision, data, scales, biases)
    raise ValueError(f"checkpoint precision {precision!r} is not one of {', '.join(PRECISIONS)}")


def unpack_joined(parts: list) -> mx.array | None:
    """The float32 arrays of `parts` (PackedArrays of one precision and layout) joined
    along their first axis, lazily: the packed forms are joined first, then unpacked
    once, so a batch merge of packed states moves the packed bytes plus one unpack
    pass. None when the parts are not all such PackedArrays."""
    first = parts[0] if parts else None
    if not isinstance(first, PackedArray) or not all(
        isinstance(p, PackedArray)
        and p.precision == first.precision
        and (p.scales is None) == (first.scales is None)
        for p in parts
    ):
        return None

    def join(get):
        arrays = [get(p) for p in parts]
        return None if arrays[0] is None else mx.concatenate(arrays, axis=0)

    joined = PackedArray(
        first.precision,
        join(lambda p: p.data),
        join(lambda p: p.scales),
        join(lambda p: p.biases),
    )
    return joined.unpack()


def unpack(a):
    """The float32 array a PackedArray holds (lazy); anything else as it is."""
    return a.unpack() if isinstance(a, PackedArray) else a


def pack_snapshot(snapshot, precision: str):
    """The StateSnapshot with its float32 state arrays packed (evaluated); the same object
    when `precision` is "exact"."""
    from engine.runtime import layer_caches

    if precision == "exact":
        return snapshot
    if precision not in PRECISIONS:
        raise ValueError(
            f"checkpoint precision {precision!r} is not one of {', '.join(PRECISIONS)}"
        )

    def layer(state):
        if isinstance(state, layer_caches.ArraysState):
            return replace(state, arrays=tuple(pack_array(a, precision) for a in state.arrays))
        if isinstance(state, layer_caches.ListState):
            return replace(state, parts=tuple(layer(p) for p in state.parts))
        return state

    packed = replace(snapshot, layers=tuple(layer(s) for s in snapshot.layers))
    mx.eval(list(layer_caches.arrays_of(packed)))
    return packed


def pack_states(states: dict, precision: str) -> dict:
    """length -> snapshot, every snapshot packed (`pack_snapshot`)."""
    return {n: pack_snapshot(s, precision) for n, s in states.items()}
