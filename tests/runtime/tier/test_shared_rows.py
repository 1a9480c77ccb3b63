"""Prefix rows stored once, on the real RAM tier (real MLX, no Ray).

Sub-agents on one system prompt restore its anchor; each stores its conversation as
the rows after the anchor only, reading the anchor's rows as its first ones. The
tier holds the anchor's rows once (the bytes the manager counts are the bytes the
tier holds), a restore from such an entry gives what a cold prefill gives, evicting
a sub-agent frees only its own rows, and an entry whose prefix entry leaves takes
those rows into buffers of its own first.
"""

from __future__ import annotations

import gc

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import BatchKVCache

from engine.cache.kinds import Role
from engine.cache.messages import Orders
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime import layer_caches
from engine.runtime.batching.batch import merge_with_room
from engine.runtime.local import LocalEngine
from engine.runtime.tier.stats import generator_stats

SYSTEM = 300  # the anchor's tokens
AGENTS = 3


def _tokens(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(20, 3000, n)]


def _config(min_rows: int = 64) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(prefill_step_size=128),
        cache=CacheConfig(
            cache_dir=None, ram_budget=1 << 30, guard_min_suffix=10_000, shared_rows_min=min_rows
        ),
    )


@pytest.fixture(scope="module")
def loaded():
    from engine.runtime.model.loader import load_model

    return load_model(_config())


def _sub_agents(engine: LocalEngine) -> tuple[int, list[int]]:
    """The anchor's id and the sub-agents' entry ids: one prompt captures the anchor,
    the others restore it."""
    system = _tokens(1, SYSTEM)
    ids = []
    for k in range(AGENTS + 1):
        turn = engine.run(system + _tokens(100 + k, 40), max_tokens=4, anchor_len=SYSTEM)
        ids.append(turn.plan.new_entry_id)
    (anchor,) = engine.manager.index.entries(Role.ANCHOR)
    return anchor.id, ids


def _kv_bytes_per_token(engine: LocalEngine) -> int:
    return engine.manager.index.get(next(iter(engine.tier.entries))).kv_bytes_per_token


def test_sub_agents_on_one_anchor_hold_its_rows_once(loaded):
    engine = LocalEngine(_config(), loaded)
    anchor_id, ids = _sub_agents(engine)
    tier, index = engine.tier, engine.manager.index
    anchor = tier.entries[anchor_id]
    for entry_id in ids:
        held = tier.entries[entry_id]
        assert held.prefix is not None and held.prefix.entry is anchor, entry_id
        assert held.prefix.length == SYSTEM and held.own_rows == held.length - SYSTEM
        assert layer_caches.entry_length(held.layers) == held.own_rows  # no row twice
        assert index.get(entry_id).prefix_id == anchor_id
    # The manager counts what the tier holds, and the anchor's rows once.
    assert tier.nbytes == sum(e.nbytes for e in index.entries())
    kvpt = _kv_bytes_per_token(engine)
    assert index.shared_bytes() == len(ids) * SYSTEM * kvpt

    # Stored whole (sharing off), the same traffic holds one copy more per sub-agent.
    whole = LocalEngine(_config(min_rows=1 << 30), loaded)
    _sub_agents(whole)
    assert all(e.prefix is None for e in whole.tier.entries.values())
    assert whole.tier.nbytes - tier.nbytes == len(ids) * SYSTEM * kvpt


def test_a_restore_from_a_sharing_entry_is_the_cold_prefill(loaded):
    engine = LocalEngine(_config(), loaded)
    _, ids = _sub_agents(engine)
    last = engine.manager.index.get(ids[-1])
    follow = [int(t) for t in last.tokens] + _tokens(7, 30)
    warm = engine.run(follow, max_tokens=8)
    assert warm.plan.entry_id == last.id and warm.plan.length > SYSTEM  # read through the prefix
    cold = engine.run(follow, max_tokens=8, cold=True)
    assert warm.ids == cold.ids


def test_the_batch_merge_writes_every_segment_in_place(loaded):
    """The merged batch rows of an entry that reads the anchor's rows are those of the
    same entry stored whole."""
    shared, whole = LocalEngine(_config(), loaded), LocalEngine(_config(1 << 30), loaded)
    merged = []
    for engine in (shared, whole):
        _, ids = _sub_agents(engine)
        held = engine.tier.entries[ids[-1]]
        caches = engine.tier.restore(ids[-1], held.length)
        merged.append(merge_with_room([caches], room=16))
    assert shared.tier.entries[ids[-1]].prefix is not None
    assert whole.tier.entries[ids[-1]].prefix is None
    compared = 0
    for a, b in zip(*merged):
        if isinstance(a, BatchKVCache):
            n = a._idx
            assert n == b._idx and n > SYSTEM
            assert mx.array_equal(a.keys[..., :n, :], b.keys[..., :n, :]).item()
            assert mx.array_equal(a.values[..., :n, :], b.values[..., :n, :]).item()
            compared += 1
    assert compared


def test_evicting_a_sub_agent_frees_only_its_own_rows(loaded):
    engine = LocalEngine(_config(), loaded)
    anchor_id, ids = _sub_agents(engine)
    tier = engine.tier
    victim = tier.entries[ids[1]]
    own = victim.nbytes
    assert own < victim.length * _kv_bytes_per_token(engine)  # the anchor's rows are not its own
    before, memory = tier.nbytes, _active_memory()
    del victim
    tier.apply(Orders(free=(ids[1],)))  # what the manager orders when it evicts it
    assert tier.nbytes == before - own
    # MLX let go of its own buffers (give or take the allocator's rounding), not of
    # the anchor's rows it read.
    freed, shared = memory - _active_memory(), SYSTEM * _kv_bytes_per_token(engine)
    assert own <= freed < own + shared // 4, (freed, own, shared)
    anchor = tier.entries[anchor_id]
    assert all(tier.entries[i].prefix.entry is anchor for i in ids if i != ids[1])


def _active_memory() -> int:
    gc.collect()
    return mx.get_active_memory()


def test_an_entry_whose_prefix_entry_leaves_takes_its_rows(loaded):
    engine = LocalEngine(_config(), loaded)
    anchor_id, ids = _sub_agents(engine)
    tier = engine.tier
    held = tier.entries[ids[-1]]
    before = tier.nbytes
    restored = tier.restore(ids[-1], held.length)
    keys = restored[_first_kv(restored)].keys
    mx.eval(keys)
    tier.apply(Orders(rejoin=tuple(ids), free=(anchor_id,)))
    assert tier.rejoined == len(ids)
    assert generator_stats(engine.generator).rejoined == len(ids)  # what the actor reports
    assert all(tier.entries[i].prefix is None for i in ids)
    again = tier.restore(ids[-1], held.length)[_first_kv(restored)].keys
    assert mx.array_equal(keys, again).item()  # the same rows, now its own
    anchor_own = SYSTEM * tier.entries[ids[0]].nbytes // max(1, tier.entries[ids[0]].length)
    assert tier.nbytes > before - anchor_own  # each reader holds the anchor's rows now


def _first_kv(caches: list) -> int:
    return next(i for i, c in enumerate(caches) if getattr(c, "keys", None) is not None)
