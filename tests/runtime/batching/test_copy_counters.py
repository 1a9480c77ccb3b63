"""The copy counters equal the copies MLX measures, path by path.

Each copy the engine's batches make is done once on sequences with many MB
of KV each (restored from a stored entry whose rows are tiled), everything
evaluated and synchronized first, with every array from before still held (so
nothing is freed during the copy): MLX's active memory then grows by exactly
the new buffers (its peak by the new and the transient ones). The counters
(`restore_copies`, `commit_copies`, the `CopyLedger`) must equal that, less
what was allocated without a copy (merge room and padding, a grown buffer's
new rows; computed from the buffers' shapes), within TOL: the few KB of
offsets, paddings and log-probabilities beside tens of MB of KV.
"""

from __future__ import annotations

import dataclasses
import gc

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from engine.runtime.batching.batch import LineageBatchGenerator, merge_with_room
from engine.runtime.layer_caches import StoredKV, restore, store_entry
from engine.runtime.model.tiny_models import build_model

ROWS = 8192  # restored KV rows per sequence: 4 MB of KV on the tiny model
TOL = 64 << 10


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3_next")


@pytest.fixture(scope="module")
def entry(model):
    """(layers, state) of a stored entry of ROWS tokens: a real 64-token prefill's KV
    rows tiled, its state (restores need only shapes and a state at the length)."""
    cache = make_prompt_cache(model)
    model(mx.array([list(range(3, 67))]), cache=cache)
    layers, state = store_entry(cache)
    reps = ROWS // 64

    def tile(layer):
        if not isinstance(layer, StoredKV):
            return layer
        keys, values = (mx.concatenate([a] * reps, axis=2) for a in (layer.keys, layer.values))
        return StoredKV(keys, values, ROWS)

    layers = [tile(layer) for layer in layers]
    mx.eval([a for layer in layers if layer is not None for a in (layer.keys, layer.values)])
    return layers, dataclasses.replace(state, length=ROWS)


def _restored(entry):
    layers, state = entry
    return restore(layers, state, ROWS)


def _arrays(obj) -> list:
    """Every array in obj: nested lists, tuples and dicts, layer caches (their state)."""
    if isinstance(obj, mx.array):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [a for x in obj for a in _arrays(x)]
    if isinstance(obj, dict):
        return [a for x in obj.values() for a in _arrays(x)]
    if hasattr(obj, "state") and not isinstance(obj, type):
        return [a for _, a in tree_flatten(obj.state) if isinstance(a, mx.array)]
    return []


class Measure:
    """MLX memory around one operation, every array of `held` kept alive meanwhile."""

    def __init__(self, held):
        # Garbage of earlier tests, collected mid-operation, would free MLX buffers inside
        # the measured span (seen under load: active growth below zero).
        gc.collect()
        gc.disable()
        self.held = _arrays(held)
        mx.eval(self.held)
        mx.synchronize()
        mx.clear_cache()
        self.active0 = mx.get_active_memory()
        mx.reset_peak_memory()

    def done(self, outputs) -> tuple[int, int]:
        """(active, peak) growth once `outputs` are evaluated."""
        mx.eval(_arrays(outputs))
        mx.synchronize()
        gc.enable()
        return mx.get_active_memory() - self.active0, mx.get_peak_memory() - self.active0


def _unwritten(caches) -> int:
    """Bytes of BatchKVCache rows no sequence holds (merge room, left padding)."""
    out = 0
    for c in caches:
        if isinstance(c, BatchKVCache) and c.keys is not None:
            B, H, cap, D = c.keys.shape
            row = H * (D + c.values.shape[3]) * c.keys.itemsize
            held = sum(c._idx - p for p in c.left_padding.tolist())
            out += (B * cap - held) * row
    return out


def _total(ledger) -> int:
    return sum(ledger.by_uid.values())


def test_the_merge_counts_the_restored_rows_and_states(entry):
    caches = [_restored(entry), _restored(entry)]
    m = Measure([caches, entry])
    copied = [0, 0]
    merged = merge_with_room(caches, room=40, copied=copied)
    active, _ = m.done(merged)
    assert sum(copied) > 2 * 2 * 1024 * 1024
    assert abs(active - _unwritten(merged) - sum(copied)) <= TOL, (active, sum(copied))


def _decoding(model, entry, n: int, max_tokens: int = 400) -> LineageBatchGenerator:
    """A generator with `n` restored sequences in its generation batch."""
    gen = LineageBatchGenerator(model, prefill_step_size=16)
    uids = gen.insert_segments(
        [[[5 + k, 6, 7]] for k in range(n)],
        max_tokens=[max_tokens] * n,
        caches=[_restored(entry) for _ in range(n)],
    )
    while len(gen._generation_batch) < n:
        gen.next()
    assert sorted(gen._generation_batch.uids) == sorted(uids)
    return gen


def test_a_sequence_leaving_charges_the_rows_gathered_for_the_others(model, entry):
    gen = _decoding(model, entry, 3)
    batch = gen._generation_batch
    kept = [batch.uids[0], batch.uids[2]]
    before = dict(gen.ledger.by_uid)
    m = Measure([batch.prompt_cache, entry])
    batch.filter([0, 2])  # what the batch does when the middle sequence finishes
    active, _ = m.done(batch.prompt_cache)
    charged = {u: gen.ledger.by_uid.get(u, 0) - before.get(u, 0) for u in kept}
    assert min(charged.values()) > 2 * 1024 * 1024
    assert abs(active - sum(charged.values())) <= TOL, (active, charged)


def test_sequences_joining_charge_the_new_buffers_and_the_padded_copies(model, entry):
    gen, other = _decoding(model, entry, 1), _decoding(model, entry, 1)
    gen.next()  # one token ahead: mlx-lm pads the newcomer's side to the same index
    batch, newcomer = gen._generation_batch, other._generation_batch
    before, transient = _total(gen.ledger), gen.ledger.transient
    m = Measure([batch.prompt_cache, newcomer.prompt_cache, entry])
    batch.extend(newcomer)  # what a step does when a sequence starts decoding beside others
    active, peak = m.done(batch.prompt_cache)
    charged = _total(gen.ledger) - before
    padded = gen.ledger.transient - transient
    assert charged > 2 * 2 * 1024 * 1024 and padded > 0
    assert abs(active - (charged - padded)) <= TOL, (active, charged, padded)  # the new buffers
    # The padded copies are freed as the concatenation consumes them: how many live at
    # once depends on MLX's order of evaluation, so the peak sees one (a layer's keys
    # or values) to all of them.
    one = padded // (2 * sum(isinstance(c, BatchKVCache) for c in batch.prompt_cache))
    assert active + one - TOL <= peak <= active + padded + TOL, (active, peak, padded)


def test_a_copying_extraction_counts_its_rows(model, entry):
    gen = _decoding(model, entry, 2)
    batch = gen._generation_batch
    uid = batch.uids[0]
    m = Measure([batch.prompt_cache, entry])
    out = batch.extract_cache(0)  # several in the batch: mlx-lm's copy
    active, _ = m.done(out)
    assert gen.commit_copies[uid] > 2 * 1024 * 1024
    assert abs(active - gen.commit_copies[uid]) <= TOL, (active, gen.commit_copies)


def test_a_buffer_that_outgrows_its_room_charges_its_old_rows(model, entry):
    gen = _decoding(model, entry, 2)
    batch = gen._generation_batch
    kv = [c for c in batch.prompt_cache if isinstance(c, BatchKVCache)]
    while kv[0]._idx < kv[0].keys.shape[2]:  # decode until the buffers are full
        gen.next()
    old = sum(c.keys.nbytes + c.values.nbytes for c in kv)
    before = _total(gen.ledger)
    m = Measure([batch.prompt_cache, entry])  # every KV buffer grows now: none is written in place
    gen.next()
    active, _ = m.done(batch.prompt_cache)
    charged = _total(gen.ledger) - before
    assert charged == old
    new_rows = sum(c.keys.nbytes + c.values.nbytes for c in kv) - old
    assert abs(active - new_rows - charged) <= TOL, (active, new_rows, charged)


def test_a_prompt_batch_split_and_an_extraction_mid_prefill_count_their_rows(model, entry):
    gen = LineageBatchGenerator(model, prefill_step_size=16)
    uids = gen.insert_segments(
        [[list(range(5, 65))], [list(range(7, 97))]],
        max_tokens=[4, 4],
        caches=[_restored(entry), _restored(entry)],
    )
    gen.next()  # the merge and a first chunk of both
    batch = gen._prompt_batch
    assert batch.uids == uids
    m = Measure([batch.prompt_cache, entry])
    out = gen.prefill_extract(uids[0])  # an anchor captured mid-prefill: a copy of its rows
    active, _ = m.done(out)
    assert gen.commit_copies[uids[0]] > 2 * 1024 * 1024
    assert abs(active - gen.commit_copies[uids[0]]) <= TOL, (active, gen.commit_copies)
    del out
    before = _total(gen.ledger)
    m = Measure([batch.prompt_cache, entry])
    moved = batch.split([0])  # one moves to decode while the other keeps prefilling
    active, _ = m.done([batch.prompt_cache, moved.prompt_cache])
    charged = _total(gen.ledger) - before
    assert charged > 2 * 2 * 1024 * 1024
    assert abs(active - charged) <= TOL, (active, charged)
