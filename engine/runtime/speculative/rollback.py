"""Exact rollback of a verify forward, per row, for every kind of layer cache.

A verify forward feeds each row of the generation batch its current token and
its drafts (`fed` positions, the same for every row); each row then keeps only
its first `keep[r]` of them (the current token and the drafts it accepted).
Afterwards every layer cache must be exactly what plain decoding of those kept
tokens would have left:

- append-only caches (`BatchKVCache`, the KV parts of a `CacheList`: MLA's
  latent KV and DSA's indexer keys) are trimmed: the batch keeps the longest
  row's kept positions, and each shorter row's surplus positions become left
  padding (mlx-lm's `finalize` of a right-padded batch: the row is rolled right
  and its padding grows), so no row attends to a rejected token;
- state caches (`ArraysCache`: the conv window and recurrent matrix of GDN,
  KDA, Mamba; `BatchRotatingKVCache`: a sliding window whose in-place writes
  overwrite old rows) cannot be cut back. Their state before the verify is
  kept (`take`: the arrays are immutable, so holding them costs nothing but a
  slice object for the rotating window's in-place buffer), and the rollback
  restores it and replays each row's kept tokens in one right-padded forward
  (`lengths` stop each row's recurrence at its own end, as mlx-lm's batched
  prefill does). Rows that kept every position skip nothing: the replay
  recomputes their state identically.

Why replay and not per-step capture: capturing the state after every verify
position needs each recurrent kernel (GDN, KDA, Mamba's SSM, their conv
windows) to write out T states instead of one, per architecture; the replay
is mlx-lm's own batched prefill path, the same for every cache kind, and is
paid only on a step where some row rejected a draft (see docs/speculative.md,
"Why replay, not per-step capture").

It knows mlx-lm's batch caches; it knows nothing of drafts or acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

from engine.runtime.speculative.state_replay import MixerTaps


def _kv_only(cache) -> bool:
    if type(cache) is CacheList:
        return all(_kv_only(c) for c in cache.caches)
    return isinstance(cache, BatchKVCache)


def hold(cache):
    """What restores `cache` to now (None: an append-only cache, trimmed instead).

    Batch caches and single-sequence ones alike (engine.runtime.speculative.draft_model rolls its
    own caches back with these)."""
    if type(cache) is CacheList:
        return tuple(hold(c) for c in cache.caches)
    if isinstance(cache, (BatchKVCache, KVCache, QuantizedKVCache)):
        return None
    if isinstance(cache, ArraysCache):
        return list(cache.cache), cache.lengths  # the layers assign new arrays: no copy
    if isinstance(cache, (BatchRotatingKVCache, RotatingKVCache)):
        state = list(cache.state)
        # Its in-place writes would show through the cache's own array objects: slices
        # are objects of their own over the buffer (copy-on-write when written).
        state[0] = None if state[0] is None else state[0][:]
        state[1] = None if state[1] is None else state[1][:]
        # (a RotatingKVCache's state holds its offsets too)
        return state, getattr(cache, "_lengths", None)
    raise ValueError(f"{type(cache).__name__}: no speculative rollback for this cache kind")


def put_back(cache, held, fed: int) -> None:
    """Restore `cache` to when `hold` returned `held`, `fed` positions ago."""
    if type(cache) is CacheList:
        for c, s in zip(cache.caches, held):
            put_back(c, s, fed)
    elif isinstance(cache, (BatchKVCache, KVCache, QuantizedKVCache)):
        cache.trim(fed)
    elif isinstance(cache, ArraysCache):
        cache.cache, cache.lengths = list(held[0]), held[1]
    elif isinstance(cache, RotatingKVCache):
        cache.state = tuple(held[0])
    else:
        cache.state, cache._lengths = list(held[0]), held[1]


def replays(caches: list) -> bool:
    """Whether a rollback of these caches replays (some layer holds state), or only trims."""
    return not all(_kv_only(c) for c in caches)


@dataclass
class Snapshot:
    """The batch's caches before a verify forward of `fed` positions."""

    saved: list
    kv_only: bool  # no state cache: a rollback trims and replays nothing
    taps: MixerTaps | None = None  # open during the verify: the mixers' inputs


def take(caches: list, taps: MixerTaps | None = None) -> Snapshot:
    """Keep what a rollback needs (no copies: state arrays are held, KV is trimmed later);
    with `taps`, the recurrent mixers keep their inputs during the verify forward."""
    kv_only = not replays(caches)
    if kv_only:
        return Snapshot([None] * len(caches), True)
    if taps is not None:
        taps.open()
    return Snapshot([hold(c) for c in caches], False, taps)


def _prepare(cache, keep: list[int], padding: list[int]) -> None:
    if type(cache) is CacheList:
        for c in cache.caches:
            _prepare(c, keep, padding)
    elif isinstance(cache, ArraysCache):
        cache.lengths = mx.array(keep)
    else:  # BatchKVCache, BatchRotatingKVCache: their right padding becomes left padding
        cache.prepare(lengths=keep, right_padding=padding)


def _finalize(cache) -> None:
    if type(cache) is CacheList:
        for c in cache.caches:
            _finalize(c)
    elif isinstance(cache, ArraysCache):
        cache.lengths = None  # left_padding stays: every row is past it
    else:
        cache.finalize()


def roll_back(model, caches: list, snapshot: Snapshot, tokens: list[list[int]], keep: list[int]):
    """Leave each row r of `caches` as if only `tokens[r][:keep[r]]` had been fed.

    `tokens[r]` are the `fed` tokens the verify forward gave row r. Returns
    the number of positions replayed (0 when nothing needed it)."""
    fed = len(tokens[0])
    mixed = snapshot.taps.close() if snapshot.taps is not None else None
    if all(k == fed for k in keep):
        return 0
    longest = max(keep)
    padding = [longest - k for k in keep]
    if snapshot.kv_only or mixed is not None:
        state = set(mixed or ())  # the mixers' caches: restored and replayed alone
        for i, c in enumerate(caches):
            if i in state:
                put_back(c, snapshot.saved[i], fed)
                continue
            _trim(c, fed - longest)
            if any(padding):
                _prepare(c, keep, padding)
                _finalize(c)
        if mixed:
            snapshot.taps.replay(caches, mixed, keep)
        mx.eval([c.state for c in caches])
        return longest if mixed else 0
    for c, s in zip(caches, snapshot.saved):
        put_back(c, s, fed)
    for c in caches:
        _prepare(c, keep, padding)
    model(mx.array([row[:longest] for row in tokens]), cache=caches)
    for c in caches:
        _finalize(c)
    mx.eval([c.state for c in caches])
    return longest


def _trim(cache, n: int) -> None:
    if n > 0:
        cache.trim(n)  # a CacheList trims each of its caches
