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

from engine.config.cache import CHECKPOINT_PRECISIONS

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
    import mlx.core as mx

    from engine.runtime import layer_caches
    from engine.runtime.batching.batch import merge_with_room

    live = merge_with_room([engine.tier.restore(entry_id, length)], 0)  # a running sequence
    _eval_caches(live)

    def capture():  # the generator's snapshot of a sequence in the batch, then its packing
        snap = layer_caches.snapshot_state(live, 0)
        if pack is not None:
            snap = pack(snap)
        mx.eval(layer_caches.arrays_of(snap))

    def restore():
        caches = engine.tier.restore(entry_id, length)
        _eval_caches(merge_with_room([caches], 0))

    def commit():
        merged = merge_with_room([engine.tier.restore(entry_id, length)], 0)
        extracted = [c.extract(0) for c in merged]
        layer_caches.store_entry(extracted)

    kv_k = max(length, 1) / 1000
    out = {
        "capture_s": _median_s(capture),
        "restore_s": _median_s(restore),
        "commit_s": _median_s(commit),
    }

    # The state's part of a restore: the state layers restored (unpacked, when packed)
    # and merged into a batch of two sequences, as the generator does when another one
    # runs (mlx-lm's merge then copies every state; alone, it keeps the arrays); no KV.
    def states():
        caches = engine.tier.restore(entry_id, length)
        return [c for c in caches if layer_caches.layer_kind(c) != layer_caches.APPEND]

    def state_restore():
        if states():
            _eval_caches(merge_with_room([states(), states()], 0))

    out["restore_state_s"] = _median_s(state_restore, 3 * REPEATS)

    # A warm turn's first step: the restore, the merge and the forward of a 32-token
    # suffix (what a returning turn pays before its first token).
    suffix = mx.array([[int(t) for t in entry.tokens[:32]]])

    def warm_turn():
        merged = merge_with_room([engine.tier.restore(entry_id, length)], 32)
        mx.eval(engine.model(suffix, cache=merged))

    out["_restorers"] = (state_restore, warm_turn)
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


def measure_precision(config, loaded, shape, length: int, precision: str, seed: int) -> dict:
    """Bytes and times of one conversation's entry with checkpoints kept at `precision`."""
    from engine.runtime import layer_caches
    from engine.runtime.batching.batch import merge_with_room
    from engine.runtime.local import LocalEngine
    from engine.runtime.model.shape_models import expected, full_depth
    from engine.runtime.packed_state import pack_snapshot

    cache = dataclasses.replace(config.cache, checkpoint_precision=precision)
    engine = LocalEngine(dataclasses.replace(config, cache=cache), loaded)
    entry, entry_id, r = run_conversation(engine, length, seed, f"{shape.name}-{precision}")
    prompt_end = min(entry.states)
    state = entry.states[prompt_end]
    kv_tier = layer_caches.kv_bytes_per_token(entry.layers)
    # In the batch: the engine's merge of the restored sequence (what a running one holds).
    merged = merge_with_room([engine.tier.restore(entry_id, prompt_end)], 0)
    _eval_caches(merged)
    batch_state = layer_caches.snapshot_state_single(merged).nbytes
    cut = expected(shape.config)
    n_state, n_kv = cut["state_layers"] or 1, cut["kv_layers"] or 1
    full = full_depth(shape, state.nbytes / n_state, engine.info.kv_bytes_per_token / n_kv)
    full_batch = full_depth(shape, batch_state / n_state, engine.info.kv_bytes_per_token / n_kv)
    timed = times(
        engine,
        entry,
        entry_id,
        prompt_end,
        None if precision == "exact" else lambda s: pack_snapshot(s, precision),
    )
    restorer = timed.pop("_restorers")
    return restorer, {
        "checkpoint_bytes": full["checkpoint_bytes"],
        "kv_bytes_per_token": full["kv_bytes_per_token"],
        "cut_depth": {
            "checkpoint_bytes": {"batch": batch_state, "ram_tier": state.nbytes},
            "kv_bytes_per_token": {"batch": engine.info.kv_bytes_per_token, "ram_tier": kv_tier},
        },
        "full_depth_batch_checkpoint_bytes": full_batch["checkpoint_bytes"],
        "manager_ram_bytes": engine.manager.stats().ram_bytes,
        "times": timed,
        "disk": disk(entry, entry_id, r, engine.info.fingerprint),
    }


def restore_cost(exact, packed, rounds: int = 41) -> dict:
    """A packed checkpoint's restore against an exact one's, interleaved round by round
    (the machine's other load falls on both alike): medians in seconds, and their ratio."""
    a, b = [], []
    for _ in range(rounds):
        a.append(_median_s(exact, 1))
        b.append(_median_s(packed, 1))
    exact_s, packed_s = float(np.median(a)), float(np.median(b))
    return {
        "rounds": rounds,
        "exact_s": exact_s,
        "packed_s": packed_s,
        "ratio": packed_s / exact_s if exact_s else None,
    }


def measure_shape(
    config, shape, shape_dir: Path, length: int, served: str, drift_tokens: int, seed: int = 0
) -> dict:
    """Every figure of one shape: bytes at the cut and the published depth for the exact
    baseline and the served precision, times, disk, drift."""
    from clients.bench.memory.drift import measure_drift
    from engine.runtime.model.loader import load_model
    from engine.runtime.model.shape_models import expected

    loaded = load_model(config)
    precisions = list(CHECKPOINT_PRECISIONS)
    restorers, by = {}, {}
    if expected(shape.config)["state_layers"]:
        for p in precisions:
            restorers[p], by[p] = measure_precision(config, loaded, shape, length, p, seed)
    else:  # no state layer, no checkpoint to pack: every precision stores what exact does
        restorers["exact"], by["exact"] = measure_precision(
            config, loaded, shape, length, "exact", seed
        )
        for p in precisions:
            restorers[p], by[p] = restorers["exact"], by["exact"]
    base, out_p = by["exact"], by[served]
    full = expected(shape.published)
    out = {
        "shape": shape.name,
        "source": shape.source,
        "cut": shape.cut_note,
        "model_dir": str(shape_dir),
        "weights_bytes": loaded[2].weights_bytes,
        "tokens": length,
        "served_precision": served,
        "layers": {k: full[k] for k in ("layers", "state_layers", "kv_layers")},
        "cut_layers": {k: v for k, v in expected(shape.config).items() if "layers" in k},
        "formula": {"cut": expected(shape.config), "full": full},
        "checkpoint_bytes": {
            "served": out_p["checkpoint_bytes"],
            "baseline": base["checkpoint_bytes"],
        },
        "checkpoint_bytes_by_precision": {p: by[p]["checkpoint_bytes"] for p in precisions},
        "kv_bytes_per_token": {
            "served": out_p["kv_bytes_per_token"],
            "baseline": base["kv_bytes_per_token"],
        },
        "precisions": by,
    }
    if full["state_layers"]:
        packed = [p for p in precisions if p != "exact"]
        out["restore_costs"] = {
            p: restore_cost(restorers["exact"][0], restorers[p][0]) for p in packed
        }
        out["warm_turn_costs"] = {
            p: restore_cost(restorers["exact"][1], restorers[p][1], 15) for p in packed
        }
        if served != "exact":
            out["restore_cost_ratio"] = out["restore_costs"][served]["ratio"]
            out["warm_turn_cost_ratio"] = out["warm_turn_costs"][served]["ratio"]
    if drift_tokens and full["state_layers"]:
        rng = np.random.default_rng(seed + 7)
        vocab = loaded[2].vocab_size
        prompt = [int(t) for t in rng.integers(10, vocab - 10, size=min(length, 512))]
        others = [p for p in precisions if p != "exact"]
        out["drift"] = measure_drift(config, loaded, prompt, others, drift_tokens)
    return out
