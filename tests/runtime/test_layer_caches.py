"""engine.runtime.layer_caches: classification, round trips of every cache kind,
copy-on-write safety, state-only snapshot bytes, zero-copy restores."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import _merge_caches
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    KVCache,
    RotatingKVCache,
    _BaseCache,
    make_prompt_cache,
)

from engine.runtime.layer_caches import (
    ArraysState,
    CopyCounter,
    ListState,
    OpaqueState,
    StoredKV,
    StoredList,
    WindowState,
    entry_length,
    join_rows,
    kv_bytes_per_token,
    layer_kind,
    nbytes,
    restore,
    snapshot_state,
    snapshot_state_single,
    store_entry,
)
from engine.runtime.model.tiny_models import build_model, config_for

H, D = 2, 64  # kv heads, head dim (64: one quantization group)


def _rand(*shape, seed=0):
    return mx.random.normal(shape, key=mx.random.key(seed))


def _kv_cache(rows, chunks=(5, 1), seed=0):
    """A KVCache filled with ``rows`` random rows, written in chunks then the rest."""
    cache = KVCache()
    sizes = [c for c in chunks if c < rows]
    for i, s in enumerate(sizes + [rows - sum(sizes)]):
        k, v = _rand(1, H, s, D, seed=seed + i), _rand(1, H, s, D, seed=seed + 99 + i)
        cache.update_and_fetch(k, v)
    mx.eval(cache.keys, cache.values)
    return cache


def _np(tree):
    """Numpy copies of every array in a nested structure (None kept)."""
    if isinstance(tree, mx.array):
        return np.array(tree)
    if isinstance(tree, (list, tuple)):
        return [_np(t) for t in tree]
    return tree


def _assert_same(a, b):
    a, b = _np(a), _np(b)
    if isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def _stored_arrays(layers, state):
    """Every array an entry and its snapshot hold, as numpy copies (for re-reading)."""
    fields = []
    for layer in layers:
        parts = layer.parts if isinstance(layer, StoredList) else (layer,)
        fields += [(p.keys, p.values) for p in parts if p is not None]
    return _np(fields), _np(_state_arrays(state))


def _state_arrays(obj):
    if isinstance(obj, mx.array):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [a for o in obj for a in _state_arrays(o)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [a for f in dataclasses.fields(obj) for a in _state_arrays(getattr(obj, f.name))]
    return []


class TallyCache(_BaseCache):
    """A cache kind engine.runtime.layer_caches does not know: a running sum and a step count."""

    def __init__(self):
        self.total = None
        self.steps = 0
        self.label = "tally"

    def update(self, x):
        self.total = x if self.total is None else self.total + x
        self.steps += 1

    @property
    def state(self):
        return self.total, self.steps

    @state.setter
    def state(self, v):
        self.total, self.steps = v

    @property
    def meta_state(self):
        return self.label

    @meta_state.setter
    def meta_state(self, v):
        self.label = v


class SubKVCache(KVCache):
    """A subclass may break the append-only rule: treated as unknown."""


@pytest.mark.parametrize(
    "cache, kind",
    [
        (KVCache(), "append"),
        (KVCache().to_quantized(), "append"),
        (BatchKVCache([0, 1]), "append"),
        (ArraysCache(2), "state"),
        (RotatingKVCache(max_size=8), "state"),
        (BatchRotatingKVCache(8, [0]), "state"),
        (CacheList(KVCache(), KVCache()), "list"),
        (TallyCache(), "state"),
        (SubKVCache(), "state"),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, str) else x,
)
def test_layer_kind(cache, kind):
    assert layer_kind(cache) == kind


# --- every kind round-trips ---------------------------------------------------


def test_kv_cache_round_trip_at_any_length():
    src = _kv_cache(20)  # 256-row buffer, 20 used
    layers, state = store_entry([src])
    (stored,) = layers
    assert isinstance(stored, StoredKV) and stored.length == 20 and state.layers == (None,)
    assert stored.nbytes == 2 * 20 * H * D * 4 and stored.bytes_per_token == 2 * H * D * 4
    for n in (20, 12, 1):
        (r,) = restore(layers, state, n)
        assert type(r) is KVCache and r.offset == n
        _assert_same(r.keys_and_values(), [src.keys[..., :n, :], src.values[..., :n, :]])
        k, v = _rand(1, H, 3, D, seed=7), _rand(1, H, 3, D, seed=8)
        keys, values = r.update_and_fetch(k, v)
        _assert_same(keys, mx.concatenate([src.keys[..., :n, :], k], axis=2))
        _assert_same(values, mx.concatenate([src.values[..., :n, :], v], axis=2))


def test_quantized_kv_cache_round_trip():
    src = _kv_cache(20).to_quantized(group_size=64, bits=8)
    layers, state = store_entry([src])
    assert layers[0].quant == (64, 8) and layers[0].length == 20
    for n in (20, 9):
        (r,) = restore(layers, state, n)
        assert (r.group_size, r.bits, r.offset) == (64, 8, n)
        want = [[a[..., :n, :] for a in src.keys], [a[..., :n, :] for a in src.values]]
        _assert_same(r.keys_and_values(), want)
        keys, _ = r.update_and_fetch(_rand(1, H, 2, D, seed=3), _rand(1, H, 2, D, seed=4))
        _assert_same([a[..., :n, :] for a in keys], want[0])
    assert kv_bytes_per_token(layers) == layers[0].nbytes // 20


def _rotated(max_size=8, keep=2):
    """A RotatingKVCache past its window: a 13-row concat, then 4 in-place rotations."""
    c = RotatingKVCache(max_size=max_size, keep=keep)
    c.update_and_fetch(_rand(1, H, 13, D, seed=1), _rand(1, H, 13, D, seed=2))
    for i in range(4):
        c.update_and_fetch(_rand(1, H, 1, D, seed=10 + i), _rand(1, H, 1, D, seed=20 + i))
    mx.eval(c.keys, c.values)
    assert c.offset == 17 and 0 < c._idx < max_size  # rotated layout
    return c


def _temporal(c):
    return [c._temporal_order(c.keys), c._temporal_order(c.values)]


def test_rotating_kv_cache_round_trip_with_rotation():
    src = _rotated()
    idx0, want = src._idx, [src.keys[...], src.values[...]]  # own objects: src writes in place
    layers, state = store_entry([src])
    (window,) = state.layers
    assert layers == (None,) and isinstance(window, WindowState)
    assert (window.offset, window.max_size, window.keep, state.length) == (17, 8, 2, 17)
    assert window.keys.shape[2] == 8
    _assert_same([window.keys, window.values], _temporal(src))

    # Same updates on the source and on fresh restores: same windows, same outputs.
    single, multi = restore(layers, state, 17)[0], restore(layers, state, 17)[0]
    new = [(_rand(1, H, 1, D, seed=40 + i), _rand(1, H, 1, D, seed=50 + i)) for i in range(3)]
    for k, v in new:
        single.update_and_fetch(k, v)
    chunk = (_rand(1, H, 5, D, seed=60), _rand(1, H, 5, D, seed=61))
    out = multi.update_and_fetch(*chunk)
    for k, v in new:
        src.update_and_fetch(k, v)
    _assert_same(_temporal(single), _temporal(src))
    assert single.offset == src.offset == 20
    # The window the source had at 17 tokens, fed the same chunk.
    ref = RotatingKVCache(max_size=8, keep=2)
    ref.state = (*want, 17, 2, 8, idx0)
    _assert_same(out, ref.update_and_fetch(*chunk))


def test_rotating_snapshot_after_long_chunk_is_window_sized():
    c = RotatingKVCache(max_size=8)
    c.update_and_fetch(_rand(1, H, 30, D), _rand(1, H, 30, D, seed=1))  # a 30-token prefill
    assert c.keys.shape[2] == 30  # all of it, until the next update trims
    state = snapshot_state_single([c])
    assert state.layers[0].keys.shape[2] == 8 and state.nbytes == 2 * 8 * H * D * 4
    (r,) = restore([None], state, 30)
    chunk = (_rand(1, H, 4, D, seed=5), _rand(1, H, 4, D, seed=6))
    _assert_same(r.update_and_fetch(*chunk), c.update_and_fetch(*chunk))


def test_arrays_cache_round_trip_and_isolation():
    src = ArraysCache(2)
    src[0], src[1] = _rand(1, 3, 8), _rand(1, 2, 4, 4, seed=1)
    layers, state = store_entry([src])
    (arrays,) = state.layers
    assert layers == (None,) and isinstance(arrays, ArraysState) and state.length is None
    assert state.nbytes == (3 * 8 + 2 * 4 * 4) * 4
    saved = _np(arrays.arrays)
    (r,) = restore(layers, state, 123)  # a pure state layer does not know its length
    _assert_same(r.cache, src.cache)
    r[0] = r[0] + 1  # how models write: replace the slot
    r[1][..., 0, :] = 5.0  # an in-place write into the restored array
    src[1][..., 1, :] = 7.0  # and into the source
    mx.eval(r[0], r[1], src[1])
    _assert_same(arrays.arrays, saved)


def test_cache_list_round_trip():
    mixed = CacheList(_kv_cache(10), ArraysCache(1))
    mixed[1][0] = _rand(1, 4, seed=3)
    dsa = CacheList(_kv_cache(10, seed=5), _kv_cache(10, seed=6))
    layers, state = store_entry([mixed, dsa])
    assert isinstance(layers[0], StoredList) and layers[0].parts[1] is None
    assert isinstance(state.layers[0], ListState) and state.layers[1].parts == (None, None)
    assert state.length == entry_length(layers) == 10
    restored = restore(layers, state, 10)
    assert all(type(c) is CacheList for c in restored)
    _assert_same(restored[0][0].keys, mixed[0].keys[..., :10, :])
    _assert_same(restored[0][1].cache, mixed[1].cache)
    _assert_same(restored[1][1].values, dsa[1].values[..., :10, :])
    # The state part pins the length; a KV-only list restores anywhere.
    with pytest.raises(ValueError):
        restore(layers, state, 6)
    (r,) = restore(layers[1:], dataclasses.replace(state, layers=state.layers[1:]), 6)
    assert r[0].offset == r[1].offset == 6


def test_unknown_kind_snapshotted_whole():
    src = TallyCache()
    src.update(_rand(1, 5))
    src.label = "custom"
    counter = CopyCounter()
    layers, state = store_entry([src], counter)
    (opaque,) = state.layers
    assert layers == (None,) and isinstance(opaque, OpaqueState) and opaque.cls is TallyCache
    assert state.nbytes == counter.copied_state == 20 and counter.copied_kv == 0
    saved = np.array(opaque.state[0])
    (r,) = restore(layers, state, 1)
    assert type(r) is TallyCache and r.steps == 1 and r.label == "custom"
    _assert_same(r.total, src.total)
    r.total[..., 0] = 100.0
    src.total[..., 1] = 100.0
    mx.eval(r.total, src.total)
    _assert_same(opaque.state[0], saved)


# --- copy-on-write: a live write never reaches a stored entry -----------------


def test_restored_writes_never_reach_the_entry():
    """qwen3_next (GDN state + KV): restore, write every way, re-read the entry."""
    model = build_model("qwen3_next")
    tokens = mx.array([list(range(3, 43))])
    src = make_prompt_cache(model)
    model(tokens[:, :30], cache=src)
    mx.eval([c.state for c in src])
    checkpoint = snapshot_state_single(src)
    model(tokens[:, 30:], cache=src)  # src's KV buffers have 256 rows, 40 used
    layers, end = store_entry(src)
    saved = _stored_arrays(layers, end), _np(_state_arrays(checkpoint))

    for n, state in ((40, end), (30, checkpoint)):  # at the end, and inside a longer buffer
        restored = restore(layers, state, n)
        model(mx.array([[7, 8, 9, 10, 11]]), cache=restored)  # a prefill chunk
        for t in (12, 13):
            model(mx.array([[t]]), cache=restored)  # decode steps
        mx.eval([c.state for c in restored])
    restored = restore(layers, end, 40)
    kv = restored[1]
    kv.keys[..., 0:4, :] = 0.0  # an in-place write into the view itself
    one_row = (1, kv.keys.shape[1], 1, kv.keys.shape[3])
    kv.update_and_fetch(_rand(*one_row, seed=1), _rand(*one_row, seed=2))
    model(mx.array([[14, 15]]), cache=src)  # the source keeps writing in place
    mx.eval(kv.keys, [c.state for c in src])

    assert src[1].keys.shape[2] == 256  # the source wrote into its own buffer
    _assert_same((_stored_arrays(layers, end), _np(_state_arrays(checkpoint))), saved)


# --- bytes: state-only snapshots, zero-copy store and restore ------------------


@pytest.mark.parametrize("arch", ["qwen3_next", "gemma3_text"])
def test_snapshot_bytes_do_not_grow_with_the_prompt(arch):
    model = build_model(arch)
    sizes = {}
    for length in (40, 400):
        cache = make_prompt_cache(model)
        model(mx.array([[(7 * i) % 4000 + 3 for i in range(length)]]), cache=cache)
        state = snapshot_state_single(cache)
        assert state.length == length
        state_caches = [c for c in cache if layer_kind(c) == "state"]
        sizes[length] = state.nbytes
        if arch == "qwen3_next":  # exactly the GDN conv windows and recurrent states
            assert state.nbytes == sum(c.nbytes for c in state_caches)
    assert sizes[40] == sizes[400] > 0


def test_store_and_restore_copy_no_kv():
    cfg = {"heads": 4, "rows": 1024, "dim": 64}
    src = [KVCache() for _ in range(2)]
    for i, c in enumerate(src):
        shape = (1, cfg["heads"], cfg["rows"], cfg["dim"])
        c.update_and_fetch(_rand(*shape, seed=i), _rand(*shape, seed=10 + i))
    mx.eval([c.state for c in src])
    kv_bytes = sum(c.nbytes for c in src)  # 4 MiB

    counter = CopyCounter()
    before = mx.get_active_memory()
    layers, state = store_entry(src, counter)
    restored = restore(layers, state, 1000, counter)
    mx.eval([c.keys for c in restored], [c.values for c in restored])
    grown = mx.get_active_memory() - before
    assert grown < kv_bytes // 100, grown
    assert counter.copied_kv == counter.copied_state == 0
    assert counter.shared_kv == nbytes(layers) + nbytes(restored[0].state[:2]) * 2
    assert kv_bytes_per_token(layers) == 2 * 2 * cfg["heads"] * cfg["dim"] * 4

    # The batch merge is the one copy, and it copies the restored rows only.
    merged = _merge_caches([restored, restore(layers, state, 600)])
    mx.eval([c.state for c in merged])
    _assert_same(merged[0].keys[0:1, :, :1000], src[0].keys[..., :1000, :])
    _assert_same(merged[1].values[1:2, :, 400:], src[1].values[..., :600, :])


def test_kv_bytes_per_token_matches_the_config():
    cfg = config_for("llama")
    model = build_model("llama")
    cache = make_prompt_cache(model)
    model(mx.array([list(range(3, 50))]), cache=cache)
    layers, state = store_entry(cache)
    per_token = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
    assert kv_bytes_per_token(layers) == per_token
    assert nbytes(layers) == 47 * per_token and state.nbytes == 0 and not state.holds_state


def test_snapshot_of_a_batch_row_is_that_sequence_only():
    model = build_model("qwen3_next")
    singles = []
    for length in (12, 20):
        cache = make_prompt_cache(model)
        model(mx.array([list(range(5, 5 + length))]), cache=cache)
        singles.append(cache)
    batch = _merge_caches(singles)
    for idx, single in enumerate(singles):
        row = snapshot_state(batch, idx)
        want = snapshot_state_single(single)
        assert row.length == want.length == (12, 20)[idx]
        assert row.nbytes == want.nbytes
        for got, ref in zip(row.layers, want.layers):
            _assert_same(_state_arrays(got), _state_arrays(ref))
    with pytest.raises(ValueError):
        snapshot_state(batch, 2)


def test_wrong_snapshot_is_caught_or_visible():
    """Guards the equivalence tests' power: a state from elsewhere changes the logits."""
    model = build_model("qwen3_next")
    tokens = list(range(3, 63))
    cold = model(mx.array([tokens]))[0, -1]
    cache = make_prompt_cache(model)
    model(mx.array([tokens[:20]]), cache=cache)
    at20 = snapshot_state_single(cache)
    model(mx.array([tokens[20:40]]), cache=cache)
    layers, at40 = store_entry(cache)
    with pytest.raises(ValueError):
        restore(layers, at40, 20)
    wrong = restore(layers, dataclasses.replace(at40, length=20), 20)
    right = restore(layers, at20, 20)

    def diff(c):
        return float(mx.abs(model(mx.array([tokens[20:]]), cache=c)[0, -1] - cold).max())

    assert diff(right) <= 1e-4 < 1e-2 < diff(wrong)


@pytest.mark.parametrize(
    "case",
    ["beyond_entry", "layer_count", "batch_cache_stored", "state_without_snapshot"],
)
def test_bad_input_raises_value_error(case):
    layers, state = store_entry([_kv_cache(8), ArraysCache(1)])
    with pytest.raises(ValueError):
        if case == "beyond_entry":
            restore(layers[:1], dataclasses.replace(state, layers=state.layers[:1]), 9)
        elif case == "layer_count":
            restore(layers[:1], state, 8)
        elif case == "batch_cache_stored":
            store_entry([BatchKVCache([0])])
        else:
            restore(layers, dataclasses.replace(state, layers=(None, None)), 8)


def test_join_rows_of_a_lone_segment_keeps_its_rows_in_a_buffer_of_their_own():
    """The first rows of one entry's layers (a prompt end taken from a cache that holds its
    reply too) are copied: the longer buffer they came from is let go."""
    import gc

    gc.collect()
    before = mx.get_active_memory()
    keys, values = mx.ones((1, 2, 1000, 64)), mx.zeros((1, 2, 1000, 64))
    mx.eval(keys, values)
    layers = (StoredKV(keys, values, 1000), None)
    joined = join_rows([(layers, 10)])
    assert entry_length(joined) == 10 and joined[1] is None
    assert mx.array_equal(joined[0].keys, keys[..., :10, :])
    del keys, values, layers
    gc.collect()
    assert mx.get_active_memory() - before <= 2 * nbytes(joined), "the 1000 rows are pinned"
