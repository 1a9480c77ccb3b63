"""Stored KV rows kept quantized (--kv-precision int8|int4): fewer bytes a token, counted
as such by the manager, restorable (dequantized into the model's dtype) from the RAM
tier, through shared prefix rows and from a file; exact stays exact.

Real MLX on the embedded model (its 32-wide heads take 32-value groups; the random
qwen3_next's 16-wide ones take none), the engine's own Generator, CacheManager, RAM
tier and DiskStore.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.cache.kinds import Role
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime import layer_caches
from engine.runtime.local import LocalEngine
from tests.runtime.tier.disk_roundtrip import write_and_load

PROMPT = [(i * 37) % 3000 + 20 for i in range(160)]
SYSTEM = 96


def _engine(model_cache_dir, kv: str, mode: str = "lineage") -> LocalEngine:
    cache = CacheConfig(
        cache_dir=str(model_cache_dir),
        ram_budget=1 << 30,
        mode=mode,
        kv_precision=kv,
        guard_min_suffix=10_000,
    )
    return LocalEngine(EngineConfig(model=ModelConfig(), cache=cache))


def _kv_layers(entry) -> list:
    return [layer for layer in entry.layers if isinstance(layer, layer_caches.StoredKV)]


def _next_logits(engine: LocalEngine, entry_id: int, length: int) -> mx.array:
    caches = engine.tier.restore(entry_id, length)
    out = engine.model(mx.array([[PROMPT[-1]]]), cache=caches)
    mx.eval(out)
    return out[0, -1]


@pytest.fixture(scope="module")
def exact(model_cache_dir):
    engine = _engine(model_cache_dir, "exact")
    r = engine.run(PROMPT, max_tokens=3)
    return engine, r.plan.new_entry_id


@pytest.mark.parametrize("kv, most", [("int8", 0.6), ("int4", 0.35)])
def test_packed_rows_are_smaller_counted_so_and_restore(exact, model_cache_dir, kv, most):
    exact_engine, exact_id = exact
    engine = _engine(model_cache_dir, kv)
    entry_id = engine.run(PROMPT, max_tokens=3).plan.new_entry_id
    entry, plain = engine.tier.entries[entry_id], exact_engine.tier.entries[exact_id]
    assert all(layer.packed[1] == int(kv[3:]) for layer in _kv_layers(entry))
    per_token = layer_caches.kv_bytes_per_token(entry.layers)
    assert per_token < most * layer_caches.kv_bytes_per_token(plain.layers)
    assert engine.manager.index.get(entry_id).kv_bytes_per_token == per_token  # counted so
    L = len(PROMPT)
    got, want = _next_logits(engine, entry_id, L), _next_logits(exact_engine, exact_id, L)
    assert got.dtype == want.dtype
    if kv == "int8":  # int4 may flip a near-tie of this random prompt's flat logits
        assert int(mx.argmax(got)) == int(mx.argmax(want))
    assert float(mx.max(mx.abs(got - want))) < 0.2 * float(mx.max(mx.abs(want)))


def test_sub_agents_share_packed_anchor_rows(model_cache_dir):
    engine = _engine(model_cache_dir, "int8")
    system = PROMPT[:SYSTEM]
    ids = [
        engine.run(system + [3000 + 7 * k + i for i in range(40)], 2, SYSTEM).plan.new_entry_id
        for k in range(3)
    ]
    (anchor,) = engine.manager.index.entries(Role.ANCHOR)
    for entry_id in ids:
        held = engine.tier.entries[entry_id]
        assert held.prefix is not None and held.prefix.entry_id == anchor.id
        assert all(layer.packed for layer in _kv_layers(held))
    # A warm turn through the packed prefix: the same tokens as a cold prefill.
    follow = [int(t) for t in engine.manager.index.get(ids[-1]).tokens] + [11, 12, 13]
    warm = engine.run(follow, max_tokens=6)
    assert warm.plan.entry_id == ids[-1]
    cold = engine.run(follow, max_tokens=6, cold=True)
    assert warm.ids == cold.ids


def test_packed_rows_survive_the_disk_tier(model_cache_dir, tmp_path):
    engine = _engine(model_cache_dir, "int4")
    entry_id = engine.run(PROMPT, max_tokens=3, namespace="disk").plan.new_entry_id
    entry = engine.tier.entries[entry_id]
    L = len(PROMPT)
    loaded = write_and_load(engine, entry_id, "disk", L, tmp_path)
    assert loaded is not None
    assert [layer.packed for layer in _kv_layers(loaded)] == [
        layer.packed for layer in _kv_layers(entry)
    ]
    assert layer_caches.nbytes(loaded.layers) == layer_caches.nbytes(entry.layers)
    before = _next_logits(engine, entry_id, L)
    engine.tier.entries[entry_id] = loaded
    assert mx.array_equal(_next_logits(engine, entry_id, L), before)  # bit for bit


def test_exact_mode_keeps_rows_exact(model_cache_dir):
    assert CacheConfig(mode="exact", kv_precision="int4").stored_kv_precision == "exact"
    engine = _engine(model_cache_dir, "int4", mode="exact")
    entry_id = engine.run(PROMPT, max_tokens=2).plan.new_entry_id
    assert not any(layer.packed for layer in _kv_layers(engine.tier.entries[entry_id]))
