"""Checkpoints kept at reduced precision (--checkpoint-precision): fewer bytes, counted as
such by the manager, restorable from the RAM tier and from a file; exact stays bit-exact.

Real MLX on the random-weight qwen3_next (its recurrent states are float32 like the
published models'), the engine's own Generator, CacheManager, RAM tier and DiskStore.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache

from engine.config import CacheConfig, EngineConfig, KernelConfig, ModelConfig
from engine.runtime import layer_caches
from engine.runtime.batching.batch import merge_with_room
from engine.runtime.local import LocalEngine
from engine.runtime.packed_state import PackedArray
from tests.runtime.tier.disk_roundtrip import write_and_load

PROMPT = [(i * 37) % 3000 + 20 for i in range(96)]


def _engine(
    model_cache_dir, model_dir, precision: str, mode: str = "lineage", host_paths: bool = True
) -> LocalEngine:
    cache = CacheConfig(
        cache_dir=str(model_cache_dir),
        ram_budget=1 << 30,
        mode=mode,
        checkpoint_precision=precision,
        guard_min_suffix=256,
    )
    kernels = KernelConfig(
        host_linear=host_paths,
        gated_delta_host_min_steps=16 if host_paths else 0,
        dense_chunk_min_keys=128 if host_paths else 1024,
    )
    return LocalEngine(
        EngineConfig(model=ModelConfig(path=str(model_dir)), cache=cache, kernels=kernels)
    )


def _stored(engine: LocalEngine, namespace: str):
    r = engine.run(PROMPT, max_tokens=3, namespace=namespace)
    entry_id = r.plan.new_entry_id
    return engine, entry_id, engine.tier.entries[entry_id]


def _packed(snapshot) -> list:
    """The arrays (packed or not) of the snapshot's recurrent layers."""
    return [a for layer in snapshot.layers if layer is not None for a in layer.arrays]


def _ram_bytes(engine: LocalEngine) -> int:
    return engine.manager.stats().ram_bytes


def _next_logits(engine: LocalEngine, entry_id: int, length: int) -> mx.array:
    """The logits of one more token after restoring the entry at `length`."""
    caches = engine.tier.restore(entry_id, length)
    out = engine.model(mx.array([[PROMPT[-1]]]), cache=caches)
    mx.eval(out)
    return out[0, -1]


@pytest.fixture(scope="module")
def exact(model_cache_dir, random_model_dir):
    return _stored(_engine(model_cache_dir, random_model_dir, "exact"), "exact")


@pytest.mark.parametrize("precision, most", [("float16", 0.6), ("bfloat16", 0.55), ("int8", 0.35)])
def test_a_packed_checkpoint_is_smaller_counted_so_and_restores(
    exact, model_cache_dir, random_model_dir, precision, most
):
    exact_engine, exact_id, exact_entry = exact
    engine, entry_id, entry = _stored(
        _engine(model_cache_dir, random_model_dir, precision), precision
    )
    L = len(PROMPT)
    packed, plain = entry.states[L], exact_entry.states[L]
    assert any(isinstance(a, PackedArray) for a in _packed(packed))
    # The recurrent states shrink; the conv windows (the weights' dtype) stay.
    assert packed.nbytes < most * plain.nbytes + 2 * 8192
    # The manager counts the packed bytes, not the exact ones.
    assert _ram_bytes(engine) < _ram_bytes(exact_engine)
    # A restore from the packed point serves, and lands near the exact one.
    got, want = _next_logits(engine, entry_id, L), _next_logits(exact_engine, exact_id, L)
    assert int(mx.argmax(got)) == int(mx.argmax(want))
    assert float(mx.max(mx.abs(got - want))) < 0.1 * float(mx.max(mx.abs(want)))


@pytest.mark.parametrize("precision", ["float16", "bfloat16", "int8"])
def test_the_batch_merge_joins_packed_states_before_unpacking(
    model_cache_dir, random_model_dir, precision
):
    """Two sequences restored from packed points merge into what their unpacked states
    merged by mlx-lm's own ArraysCache.merge give, bit for bit (the merge joins the
    packed forms, then unpacks once)."""
    engine, entry_id, entry = _stored(
        _engine(model_cache_dir, random_model_dir, precision), f"merge-{precision}"
    )
    L = len(PROMPT)
    other = engine.run([t + 1 for t in PROMPT], max_tokens=2, namespace="other").plan
    pair = [engine.tier.restore(entry_id, L), engine.tier.restore(other.new_entry_id, L)]
    merged = merge_with_room(pair, 0)
    compared = 0
    for i, layer in enumerate(merged):
        if type(layer) is not ArraysCache:
            continue
        assert all(getattr(p[i], "packed", None) for p in pair)
        plain = ArraysCache.merge([p[i] for p in pair])  # per-sequence unpack, then copy
        for a, b in zip(layer.cache, plain.cache):
            assert a.dtype == b.dtype and mx.array_equal(a, b).item()
            compared += 1
    assert compared


def test_a_packed_checkpoint_survives_the_disk_tier(model_cache_dir, random_model_dir, tmp_path):
    engine, entry_id, entry = _stored(
        _engine(model_cache_dir, random_model_dir, "int8"), "disk-int8"
    )
    L = len(PROMPT)
    loaded = write_and_load(engine, entry_id, "disk-int8", L, tmp_path)
    assert loaded is not None
    assert loaded.states[L].nbytes == entry.states[L].nbytes  # the file keeps them packed
    before = _next_logits(engine, entry_id, L)
    engine.tier.entries[entry_id] = loaded
    assert mx.array_equal(_next_logits(engine, entry_id, L), before)  # bit for bit


def test_exact_keeps_checkpoints_bit_exact(model_cache_dir, random_model_dir):
    # MLX's paths in both: the two modes stop their chunks at different capture points, and
    # whether a chunk takes a host path (engine/kernels: host_linear, the recurrence's, the
    # chunk attention's) follows its length.
    lineage = _engine(model_cache_dir, random_model_dir, "exact", host_paths=False)
    _, exact_id, exact_entry = _stored(lineage, "exact")
    L = len(PROMPT)
    assert not any(isinstance(a, PackedArray) for a in _packed(exact_entry.states[L]))
    # Exact mode ignores a reduced precision: its snapshots are whole prompts, bit for bit.
    engine, entry_id, entry = _stored(
        _engine(model_cache_dir, random_model_dir, "int8", mode="exact", host_paths=False),
        "exact-mode",
    )
    for n, state in entry.states.items():
        assert not any(isinstance(a, PackedArray) for a in _packed(state)), n
    assert CacheConfig(mode="exact", checkpoint_precision="int8").stored_precision == "exact"
    # The same prompt on the same weights: exact mode's snapshots are lineage's exact ones.
    common = set(entry.states) & set(exact_entry.states)
    assert common
    for n in common:
        got = layer_caches.arrays_of(entry.states[n])
        want = layer_caches.arrays_of(exact_entry.states[n])
        assert len(got) == len(want) and all(mx.array_equal(a, b) for a, b in zip(got, want))


def test_an_unknown_precision_is_refused_by_its_flag():
    with pytest.raises(ValueError, match="checkpoint-precision.*int3"):
        CacheConfig(checkpoint_precision="int3")


def test_float16_keeps_a_large_state_over_row_scales_and_a_small_one_plain():
    from engine.runtime.packed_state import FLOAT16_PLAIN, pack_array, unpack_joined

    small = mx.random.normal((1, 4, 8, 64))
    large = small * (4 * FLOAT16_PLAIN)  # past float16's range once squared away: 65504
    packed_small, packed_large = pack_array(small, "float16"), pack_array(large, "float16")
    assert packed_small.scales is None and packed_large.scales is not None
    for packed, plain in ((packed_small, small), (packed_large, large)):
        back = packed.unpack()
        assert back.dtype == mx.float32 and bool(mx.all(mx.isfinite(back)))
        assert float(mx.max(mx.abs(back - plain))) <= 1e-3 * float(mx.max(mx.abs(plain)))
    # Joined packed forms unpack as their parts do; plain and scaled ones do not mix.
    joined = unpack_joined([packed_large, packed_large])
    assert mx.array_equal(joined, mx.concatenate([packed_large.unpack()] * 2)).item()
    assert unpack_joined([packed_small, packed_large]) is None
