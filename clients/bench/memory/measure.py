"""One shape's cache bytes and times, measured through the engine's own runtime and tiers.

A cut model of the shape is written to a directory and served in process (the server's
Generator, CacheManager and RAM tier: `LocalEngine`); one conversation is run through
it, and its stored entry is what is measured:
- bytes: a checkpoint (a state snapshot) and a token of KV in the batch (what the
  engine's batch merge holds for one sequence), in the RAM tier (the entry as stored)
  and on disk (the file the disk tier writes, through its own writer);
- times: a capture (the snapshot the generator takes, its compression included), a
  restore (the tier's restore and the batch merge that makes it usable), a commit (the
  extraction of a finished sequence and its stored form), per checkpoint and per 1k
  tokens of KV; the disk tier's write (queued to durable) and read.
Figures that scale with depth are also given at the published depth, from the measured
per-layer bytes.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np

REPEATS = 5


def shape_config(config, shape_dir: Path, **cache):
    """The serve config with the shape's directory as its model (and cache fields set)."""
    model = dataclasses.replace(config.model, path=str(shape_dir))
    return dataclasses.replace(
        config, model=model, cache=dataclasses.replace(config.cache, **cache)
    )


def _median_s(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _eval_caches(caches) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    mx.eval([a for c in caches for _, a in tree_flatten(c.state) if isinstance(a, mx.array)])


def run_conversation(engine, length: int, seed: int, name: str):
    """One request of `length` prompt tokens and a short reply; its stored entry and id."""
    rng = np.random.default_rng(seed)
    vocab = engine.info.vocab_size
    tokens = [int(t) for t in rng.integers(10, vocab - 10, size=length)]
    r = engine.run(tokens, max_tokens=4, namespace=f"memory-{name}")
    entry_id = r.plan.new_entry_id
    return engine.tier.entries[entry_id], entry_id, r


def times(engine, entry, entry_id: int, length: int, pack=None) -> dict:
    """Capture, restore and commit times (seconds) of the entry's checkpoint at `length` and
    of its KV, and what each moves. `pack`: the tier's compression of a snapshot (None:
    exact)."""
    from engine.runtime import layer_caches
    from engine.runtime.batching.batch import merge_with_room

    restored = engine.tier.restore(entry_id, length)

    def capture():
        snap = layer_caches.snapshot_state_single(restored)
        if pack is not None:
            snap = pack(snap)
        import mlx.core as mx

        mx.eval(list(layer_caches._arrays(snap)))

    def restore():
        caches = engine.tier.restore(entry_id, length)
        _eval_caches(merge_with_room([caches], 0))

    def commit():
        merged = merge_with_room([engine.tier.restore(entry_id, length)], 0)
        extracted = [c.extract(0) for c in merged]
        layer_caches.store_entry(extracted)

    kv_k = max(length, 1) / 1000
    state_only = engine.tier.entries[entry_id].states[length]
    out = {
        "capture_s": _median_s(capture),
        "restore_s": _median_s(restore),
        "commit_s": _median_s(commit),
    }
    # The state's part of a restore: the same restore with no KV rows to copy (a
    # pure-state restore at length 0 is not served, so time the state arrays alone).
    from engine.runtime.layer_caches import ArraysState

    def state_restore():
        arrays = [
            layer_caches._restore_state(s, length, layer_caches.CopyCounter())
            for s in state_only.layers
            if isinstance(s, ArraysState)
        ]
        _eval_caches(arrays)

    out["restore_state_s"] = _median_s(state_restore)
    out["restore_kv_s_per_1k"] = max(out["restore_s"] - out["restore_state_s"], 0.0) / kv_k
    out["commit_s_per_1k"] = out["commit_s"] / kv_k
    return out


def disk(entry, entry_id: int, r, fingerprint: str) -> dict:
    """The entry written by the disk tier's own writer, then read back: bytes and seconds."""
    from engine.cache.kinds import CheckpointKind, Role
    from engine.cache.messages import EntryRecord
    from engine.runtime import layer_caches
    from engine.storage.disk_store import DiskStore

    length = entry.length
    checkpoints = tuple((n, CheckpointKind.REPLY) for n in sorted(entry.states) if n != length)
    state = entry.states[length]
    record = EntryRecord(
        entry_id,
        "memory",
        Role.CONVERSATION,
        np.asarray(entry.tokens[:length], np.int32),
        min(entry.states),
        checkpoints,
        layer_caches.kv_bytes_per_token(entry.layers),
        state.nbytes,
    )
    with tempfile.TemporaryDirectory(prefix="lineage-memory-") as d:
        store = DiskStore(d, fingerprint)
        try:
            t0 = time.perf_counter()
            store.write(entry, record)
            assert store.flush(120), "the disk write did not finish"
            write_s = time.perf_counter() - t0
            size = sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file())
            t0 = time.perf_counter()
            loaded = store.load(entry_id)
            read_s = time.perf_counter() - t0
            assert loaded is not None, "the file did not load"
        finally:
            store.close(30)
    return {
        "file_bytes": size,
        "entry_bytes": entry.nbytes,
        "states": len(entry.states),
        "write_s": write_s,
        "read_s": read_s,
        "write_mb_s": size / write_s / 1e6 if write_s else 0.0,
        "read_mb_s": size / read_s / 1e6 if read_s else 0.0,
    }


def measure_shape(config, shape, shape_dir: Path, length: int, seed: int = 0) -> dict:
    """Every figure of one shape: bytes at the cut and at the published depth, times, disk."""
    from engine.runtime import layer_caches
    from engine.runtime.batching.batch import merge_with_room
    from engine.runtime.local import LocalEngine
    from engine.runtime.model.loader import load_model
    from engine.runtime.model.shape_models import expected, full_depth

    loaded = load_model(config)
    engine = LocalEngine(config, loaded)
    entry, entry_id, r = run_conversation(engine, length, seed, shape.name)
    prompt_end = min(entry.states)
    state = entry.states[prompt_end]
    kv_tier = layer_caches.kv_bytes_per_token(entry.layers)
    # In the batch: the engine's merge of the restored sequence (what a running one holds).
    merged = merge_with_room([engine.tier.restore(entry_id, prompt_end)], 0)
    _eval_caches(merged)
    batch_state = layer_caches.snapshot_state_single(merged).nbytes
    cut = expected(shape.config)
    per_state = batch_state / cut["state_layers"] if cut["state_layers"] else 0.0
    per_kv = engine.info.kv_bytes_per_token / cut["kv_layers"] if cut["kv_layers"] else 0.0
    out = {
        "shape": shape.name,
        "source": shape.source,
        "cut": shape.cut_note,
        "model_dir": str(shape_dir),
        "weights_bytes": engine.info.weights_bytes,
        "tokens": entry.length,
        "cut_depth": {
            **cut,
            "checkpoint_bytes": {"batch": batch_state, "ram_tier": state.nbytes},
            "kv_bytes_per_token": {"batch": engine.info.kv_bytes_per_token, "ram_tier": kv_tier},
        },
        "formula": {"cut": cut, "full": expected(shape.published)},
        "full_depth": full_depth(shape, per_state, per_kv),
        "times": times(engine, entry, entry_id, prompt_end),
        "disk": disk(entry, entry_id, r, engine.info.fingerprint),
    }
    out["checkpoint_bytes"] = out["full_depth"]["checkpoint_bytes"]
    out["kv_bytes_per_token"] = out["full_depth"]["kv_bytes_per_token"]
    return out
