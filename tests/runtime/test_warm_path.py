"""Cheap warm turns: counters, the flag-file layer timer, the opt-in pool clear.

These drive the server's own Generator and CacheManager in-process (no Ray):
what is asserted are byte counters and log lines, never times.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import BatchKVCache

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.local import LocalEngine


def make_engine(cache_dir, model_dir, **cache) -> LocalEngine:
    """On the random-weight qwen3_next (`random_model_dir`): the counters depend on its
    shapes, not on the trained model's predictions."""
    return LocalEngine(
        EngineConfig(
            model=ModelConfig(path=str(model_dir), prefill_step_size=128),
            cache=CacheConfig(cache_dir=str(cache_dir), ram_budget=1 << 30, **cache),
        )
    )


@pytest.fixture(scope="module")
def local(model_cache_dir, random_model_dir):
    return make_engine(model_cache_dir, random_model_dir)


def conversation(local, first: int = 600, turns: int = 3):
    tokens = [(i * 31) % 3000 + 20 for i in range(first)]
    results = [local.run(tokens, max_tokens=3)]
    for t in range(turns):
        tokens = tokens + results[-1].ids + [(t * 7 + j) % 3000 + 20 for j in range(20)]
        results.append(local.run(tokens, max_tokens=3))
    return results


def _state_bytes(local) -> int:
    (size,) = {s.nbytes for e in local.tier.entries.values() for s in e.states.values()}
    return size


def test_warm_turns_copy_the_restored_rows_once_and_no_kv_at_commit(local):
    """The counters count every copy: the batch merge (the restored KV rows and the
    state, once), and at commit the state snapshots only (prompt end and end)."""
    results = conversation(local)
    state = _state_bytes(local)
    for r in results[1:]:
        t = r.final.timing
        assert r.final.restore_kind == "entry"
        assert t.restored_kv_bytes > 0
        assert t.bytes_copied_restore == t.restored_kv_bytes + state, "the merge, counted"
        assert t.bytes_copied_commit == 2 * state, "a commit copied KV"
    assert local.generator.bg.pool.count == 0, "the pool was cleared without the flag"


def test_sequences_finishing_together_count_their_copied_rows(local):
    """Two sequences in one batch: the first to finish leaves by mlx-lm's copying
    extraction (its KV rows), the last one alone with views."""
    from engine.cache.messages import PlanRequest
    from engine.runtime.events import Finished
    from engine.runtime.layer_caches import kv_bytes_per_token
    from engine.runtime.requests import GenerationRequest, SamplingParams

    finals = {}
    for k, max_tokens in ((0, 120), (1, 200)):  # the second joins before the first ends
        tokens = [(i * 13 + k) % 3000 + 20 for i in range(200 + 40 * k)]
        rid = f"together-{k}"
        plan = local.manager.plan(PlanRequest(rid, np.asarray(tokens, np.int32), 0, rid))
        req = GenerationRequest(rid, rid, tuple(tokens), plan, SamplingParams(max_tokens), 0, 0)
        events = finals.setdefault(rid, [])
        local.generator.submit(req, events.append)
    while local.generator.busy:
        local.generator.step()
    state = _state_bytes(local)
    first, last = (next(e for e in finals[r] if isinstance(e, Finished)) for r in finals)
    entry = local.tier.entries[local.manager.index.entries()[-2].id]
    rows = kv_bytes_per_token(entry.layers) * (first.prompt_tokens + 120)
    assert first.timing.bytes_copied_commit == rows + 2 * state
    assert last.timing.bytes_copied_commit == 2 * state, "alone: views of its rows"
    # The second joining the first's generation batch copied both (mlx-lm's extend), and
    # the first leaving copied the second's rows (the gather): each charged its own rows.
    assert first.timing.bytes_copied_batch >= rows
    assert last.timing.bytes_copied_batch >= 2 * kv_bytes_per_token(entry.layers) * (
        last.prompt_tokens
    )


def test_restore_shares_the_stored_buffers(local):
    """The restored KV arrays are views of the entry's (same data pointer), not copies."""
    conversation(local, first=300, turns=1)
    entry_id, entry = max(local.tier.entries.items(), key=lambda kv: kv[1].length)
    n = max(entry.states)
    restored = local.tier.restore(entry_id, n)
    kv_stored = [layer for layer in entry.layers if layer is not None]
    kv_restored = [c for c in restored if type(c).__name__ == "KVCache"]
    assert kv_stored and len(kv_stored) == len(kv_restored)
    for stored, cache in zip(kv_stored, kv_restored):
        assert cache.offset == n
        before = mx.get_active_memory()
        mx.eval(cache.keys, cache.values)
        assert mx.get_active_memory() - before < stored.keys.nbytes // 2


def test_merge_leaves_room_so_prefill_writes_in_place(local):
    """After the merge, the batch KV buffer has room for the uncached tokens."""
    from engine.runtime.batching.batch import merge_with_room

    conversation(local, first=300, turns=0)
    entry_id, entry = max(local.tier.entries.items(), key=lambda kv: kv[1].length)
    n = max(entry.states)
    merged = merge_with_room([local.tier.restore(entry_id, n)], room=100)
    kv = [c for c in merged if isinstance(c, BatchKVCache)]
    assert kv and all(c.keys.shape[2] >= n + 100 and c._idx == n for c in kv)


def test_layer_timer_logs_per_layer_only_while_the_flag_file_exists(
    model_cache_dir, random_model_dir, tmp_path, caplog
):
    flag = tmp_path / "time-layers"
    local = make_engine(
        model_cache_dir, random_model_dir, layer_timer_flag=str(flag), layer_timer_requests=1
    )
    n_layers = len(local.model.layers)
    with caplog.at_level(logging.INFO, logger="lineage.layers"):
        local.run(list(range(50, 90)), max_tokens=2)
    assert not [r for r in caplog.records if r.name == "lineage.layers"]
    assert not local.generator.timer.on

    flag.touch()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lineage.layers"):
        local.run(list(range(60, 100)), max_tokens=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "lineage.layers"]
    assert lines, "the flag file exists but nothing was timed"
    for line in lines:
        assert all(f"{i}:" in line for i in range(n_layers)), line
    assert not local.generator.timer.on, "the timer stays on past its request budget"

    flag.unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lineage.layers"):
        local.run(list(range(70, 110)), max_tokens=2)
    assert not [r for r in caplog.records if r.name == "lineage.layers"]


@pytest.mark.parametrize("switched_on", [False, True])
def test_pool_clear_per_prefill_chunk_is_opt_in(model_cache_dir, random_model_dir, switched_on):
    local = make_engine(model_cache_dir, random_model_dir, clear_pool_per_prefill=switched_on)
    local.run([(i * 13) % 3000 + 20 for i in range(400)], max_tokens=2)  # 4 chunks of 128
    clears = local.generator.bg.pool.count
    assert (clears >= 4) if switched_on else (clears == 0), clears


@pytest.mark.parametrize("sequences", [1, 2])
def test_a_sequence_finishing_alone_leaves_with_views_of_its_rows(local, sequences):
    """extract_alone: no KV copy for a lone sequence; mlx-lm's copy when others remain."""
    from engine.runtime.batching.batch import LineageBatchGenerator

    bg = LineageBatchGenerator(local.model, prefill_step_size=512)
    prompts = [[(i * 7 + s) % 3000 + 20 for i in range(1500)] for s in range(sequences)]
    bg.insert(prompts, max_tokens=[50] * sequences)
    while bg.generating < sequences:
        bg.next()
    gen = bg._generation_batch
    kv = next(c for c in gen.prompt_cache if isinstance(c, BatchKVCache))
    mx.eval(kv.keys, kv.values)
    before = mx.get_active_memory()
    extracted = gen.extract_cache(0)
    rows = next(c for c in extracted if type(c).__name__ == "KVCache")
    mx.eval(rows.keys, rows.values)
    grew = mx.get_active_memory() - before
    if sequences == 1:
        assert grew < rows.keys.nbytes // 2, grew
    else:
        assert grew >= rows.keys.nbytes, grew


def test_the_kept_pool_is_bounded_by_the_configured_limit(model_cache_dir, random_model_dir):
    local = make_engine(model_cache_dir, random_model_dir, pool_limit=64 << 20)
    assert local.generator.pool_limit == 64 << 20
    assert mx.set_cache_limit(64 << 20) == 64 << 20  # what the engine set
    default = make_engine(model_cache_dir, random_model_dir)
    assert default.generator.pool_limit == min(16 << 30, default.config.cache.ram_budget // 4)
