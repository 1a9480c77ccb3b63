"""What mlx-lm's batch caches copy when a batch changes shape, charged per sequence.

Besides the batch merge (`batch.merge_with_room`) and the extractions, three
things copy a batch's KV and state buffers, all inside mlx-lm's cache classes:

- `filter(keep)` (a sequence leaves: it finished, was cancelled, or a prompt
  batch split with sequences left behind) gathers the kept rows into new
  buffers: every row of the buffer, room and padding included;
- `extend(other)` (sequences join the generation batch, or mlx-lm's prompt
  batch) pads each side whose layout differs (a transient copy of that side)
  and concatenates both into new buffers;
- an update that runs out of room (`BatchKVCache.update_and_fetch`, the
  rotating cache alike) concatenates new rows onto a copy of the buffer.

`CopyLedger` charges each sequence the bytes of its own rows, per uid, from
the caches' shapes before and after each such call (the engine routes every
filter and extend through it, and checks the buffers' sizes after every
step for growth). tests/runtime/batching/test_copy_counters.py holds these figures
against MLX's memory counters, one call at a time.

It knows the layouts of mlx-lm's batch caches; it decides nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, CacheList


def _leaves(cache: Any) -> Iterable[Any]:
    """The layer caches inside `cache` (a CacheList's parts, else itself)."""
    if type(cache) is CacheList:
        for part in cache.caches:
            yield from _leaves(part)
    else:
        yield cache


def _arrays(cache: Any) -> list:
    """The KV or state buffers of one leaf cache (not its offsets and paddings)."""
    if isinstance(cache, ArraysCache):
        return [a for a in cache.cache if a is not None]
    keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
    if isinstance(keys, mx.array):
        return [keys, values]
    return []


def buffer_bytes(caches: Iterable[Any]) -> int:
    """KV and state bytes the batch layer caches hold, every row (room included)."""
    return sum(a.nbytes for c in caches for leaf in _leaves(c) for a in _arrays(leaf))


def _capacity(leaf: Any) -> int | None:
    keys = getattr(leaf, "keys", None)
    return keys.shape[2] if isinstance(keys, mx.array) and keys.ndim == 4 else None


def _pad_copies(a: Any, b: Any) -> int:
    """Bytes of the transient padded copies `BatchKVCache.extend(a, b)` makes (mlx-lm pads
    a side whose rows do not already end at the longer index and span the longer buffer)."""
    if a.keys is None and b.keys is None:
        return 0
    ref = a if a.keys is not None else b
    H, D, M, item = ref.keys.shape[1], ref.keys.shape[3], ref.values.shape[3], ref.keys.itemsize
    max_idx = max(a._idx, b._idx)
    size = max(c.keys.shape[2] for c in (a, b) if c.keys is not None)
    out = 0
    for c in (a, b):
        rows = 0 if c.keys is None else c.keys.shape[2]
        left = max_idx - c._idx
        if left != 0 or size - rows - left != 0:
            out += int(c.offset.shape[0]) * H * size * (D + M) * item
    return out


class CopyLedger:
    """Bytes of KV and state copied per sequence uid by batch reshuffles and growth."""

    def __init__(self) -> None:
        self.by_uid: dict[int, int] = {}
        self.transient = 0  # of what was charged, bytes of mlx-lm's padded copies (freed at once)
        # leaf cache -> (rows, bytes) of its buffers when last seen; weak: it keeps no buffer
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _charge(self, uids: list, total: int) -> None:
        if uids and total:
            share = total // len(uids)
            for uid in uids:
                self.by_uid[uid] = self.by_uid.get(uid, 0) + share

    def pop(self, uid: int) -> int:
        return self.by_uid.pop(uid, 0)

    def note(self, caches: list) -> None:
        """Remember the caches' buffer sizes as they are now (no copy is charged)."""
        for c in caches:
            for leaf in _leaves(c):
                rows = _capacity(leaf)
                if rows is not None:
                    self._seen[leaf] = (rows, sum(a.nbytes for a in _arrays(leaf)))

    def grown(self, caches: list, uids: list) -> None:
        """Charge the buffers that grew since they were noted (a full buffer concatenated
        with new room copies every old row), then note them as they are."""
        total = 0
        for c in caches:
            for leaf in _leaves(c):
                seen = self._seen.get(leaf)
                rows = _capacity(leaf)
                if seen is not None and rows is not None and rows > seen[0]:
                    total += seen[1]
        self._charge(uids, total)
        self.note(caches)

    def forget(self, caches: list) -> None:
        for c in caches:
            for leaf in _leaves(c):
                self._seen.pop(leaf, None)

    def filter(self, caches: list, uids: list, keep: list, run) -> None:
        """`run()` filters the batch to rows `keep`: each kept sequence is charged its rows."""
        self.grown(caches, uids)
        batch = len(uids)
        if keep and batch:
            kept = [uids[i] for i in keep]
            self._charge(kept, buffer_bytes(caches) * len(keep) // batch)
        else:
            self.forget(caches)
        run()
        self.note(caches)

    def extend(self, caches: list, uids: list, other: list, other_uids: list, run) -> list:
        """`run()` extends the batch with `other` and returns the caches: when both hold
        sequences, every sequence of both is charged its rows of the new buffers and of
        mlx-lm's padded copies."""
        self.grown(caches, uids)
        self.grown(other, other_uids)
        both = bool(caches) and bool(other) and bool(uids) and bool(other_uids)
        pads = 0
        if both:
            for a, b in zip(caches, other):
                for la, lb in zip(_leaves(a), _leaves(b)):
                    if isinstance(la, BatchKVCache) and isinstance(lb, BatchKVCache):
                        pads += _pad_copies(la, lb)
        out = run()
        if both:
            self._charge(uids + other_uids, buffer_bytes(out) + pads)
            self.transient += pads
        self.forget(other)
        self.note(out)
        return out
