"""`lineage bench restart`, phase 5: decode inter-token latency while entry files load.

`big_entries` writes large entry files to the disk tier (a held entry's KV
rows tiled to the size asked, its state, fresh token ids: entries like any
other to the format, the checks and the load path). `decode_during_load`
then decodes one request through the generator, step by step, while other
requests restore those files one after another on the reader thread: the
inter-token gaps idle before each load, while its file is read, and while
the loaded request is admitted (the finish on the loop thread, the restore,
the batch merge's copy, its prefill), apart.

Drives the engine's Generator directly (no server, no Ray); MLX and the
engine load inside the functions.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from clients.bench.figures import percentile

IDLE_TOKENS = 150  # inter-token gaps measured idle before each load


def big_entries(engine, entry_id: int, target_mb: float, count: int, draw) -> list:
    """Write `count` large entry files beside the real ones: the held entry's KV rows tiled
    to about `target_mb` MB, its state at the new length, fresh token ids. To the disk
    tier they are entries like any other (format, checks, load path): what a long
    conversation would leave, without prefilling one cold. Their token lists."""
    import mlx.core as mx
    from mlx.utils import tree_map

    from engine.cache.messages import EntryRecord
    from engine.runtime import layer_caches
    from engine.runtime.tier.ram import StoredEntry

    held = engine.tier.entries[entry_id]
    n = held.length
    per_token = layer_caches.kv_bytes_per_token(held.layers)
    reps = max(1, round(target_mb * 1e6 / (per_token * n)))
    tiled: list = []  # the new arrays, evaluated before the files are written

    def tile(layer):
        if isinstance(layer, layer_caches.StoredList):
            return layer_caches.StoredList(tuple(tile(p) for p in layer.parts))
        if not isinstance(layer, layer_caches.StoredKV) or layer.keys is None:
            return layer
        kv = tree_map(
            lambda a: mx.concatenate([a[..., :n, :]] * reps, axis=-2), (layer.keys, layer.values)
        )
        tiled.extend(kv)
        return layer_caches.StoredKV(*kv, n * reps, layer.quant)

    layers = [tile(layer) for layer in held.layers]
    mx.eval(tiled)
    state = dataclasses.replace(
        held.states[n], length=None if held.states[n].length is None else n * reps
    )
    out = []
    for i in range(count):
        tokens = draw(n * reps)
        big = StoredEntry(layers, n * reps, {n * reps: state})
        record = EntryRecord(
            engine.tier.max_id + 1000 + i,
            "",
            "conversation",
            np.asarray(tokens, np.int32),
            n * reps,
            (),
            per_token,
            state.nbytes,
        )
        engine.tier.disk_tier.write(big, record)
        out.append(tokens)
    engine.tier.disk_tier.flush(600)
    return out


class _ReadTimes:
    """The disk store's reads, timed: when each read ended (on the reader thread), and how
    long each finish took (on the loop thread). `restore` puts the store's own calls back."""

    def __init__(self, store):
        self.store = store
        self.read_end: list = []
        self.finish_ms: list = []
        self._start_read, self._finish = store.start_read, store.finish
        store.start_read, store.finish = self._timed_read, self._timed_finish

    def _timed_read(self, entry_id):
        future = self._start_read(entry_id)
        future.add_done_callback(lambda f: self.read_end.append(time.perf_counter()))
        return future

    def _timed_finish(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self._finish(*args, **kwargs)
        finally:
            self.finish_ms.append((time.perf_counter() - t0) * 1000)

    def restore(self) -> None:
        self.store.start_read, self.store.finish = self._start_read, self._finish


class _Decoding:
    """The request that decodes through every window: its token times. `step` runs the
    generator one step, and refuses once that request has ended (its gaps would stop,
    and a window waiting for them would wait for ever)."""

    def __init__(self, generator):
        self.generator = generator
        self.stamps: list = []
        self.ended: list = []

    def on_event(self, event) -> None:
        from engine.runtime.events import Finished, Tokens

        if isinstance(event, Tokens):
            self.stamps.append(time.perf_counter())
        elif isinstance(event, Finished):
            self.ended.append(event)

    def step(self) -> None:
        if self.ended:
            raise RuntimeError(f"the decoding request ended: {self.ended[0]}")
        self.generator.step()

    def until(self, done) -> None:
        while not done():
            self.step()


def _submit(engine, rid: str, tokens: list, max_tokens: int, on_event):
    """Plan and submit one request straight to the generator; its plan."""
    from engine.cache.messages import PlanRequest
    from engine.runtime.requests import GenerationRequest, SamplingParams

    plan = engine.manager.plan(PlanRequest(rid, np.asarray(tokens, np.int32)))
    req = GenerationRequest(
        rid, "", tuple(tokens), plan, SamplingParams(max_tokens), time.time(), 0.0
    )
    engine.generator.submit(req, on_event)
    return plan


def decode_during_load(engine, short: list, bigs: list, draw, progress) -> dict:
    """Inter-token latency (ms) of a decoding request, idle and while other requests'
    restores read large entry files on the reader thread, one after another; then the
    steps that admit each loaded request (the finish on the loop thread, the restore,
    the batch merge's copy, its prefill), apart. `progress(line)` after each load."""
    gen, store = engine.generator, engine.tier.disk_tier
    reads = _ReadTimes(store)
    decoding = _Decoding(gen)
    # The decoding request must outlast every window: the tiny model's greedy tokens
    # reach an EOS sooner or later (a run then spun for ever), so none stops it here.
    gen.eos_ids = frozenset()
    _submit(engine, "itl-decode", short, 1 << 20, decoding.on_event)
    decoding.until(lambda: len(decoding.stamps) >= 20)  # warm-up
    idle, reading, admitting, load_ms, file_mb = [], [], [], [], []
    for i, tokens in enumerate(bigs):
        n0 = len(decoding.stamps)  # idle just before each load: both see the same machine
        while len(decoding.stamps) < n0 + IDLE_TOKENS:
            decoding.step()
        idle += _gaps(decoding.stamps[n0:])
        load = _one_load(engine, decoding, reads, f"itl-load-{i}", tokens + draw(16))
        reading += load["reading"]
        admitting += load["admitting"]
        load_ms.append(load["load_ms"])
        file_mb.append(load["file_mb"])
        progress(
            f"  load {i}: {file_mb[-1]:.0f} MB in {load_ms[-1]:.0f} ms; gaps while reading "
            f"max {max(load['reading'], default=0):.1f} ms over {len(load['reading'])}, "
            f"idle before p99 {percentile(idle[-IDLE_TOKENS + 1 :], 99):.2f} ms"
        )
        for _ in range(20):  # the loaded request done, before the next idle window
            decoding.step()
    gen.cancel("itl-decode")
    while gen.busy or gen.pending:
        gen.step()
    reads.restore()
    return {
        "itl_idle_p50_ms": percentile(idle, 50),
        "itl_idle_p99_ms": percentile(idle, 99),
        "itl_idle_tokens": len(idle),
        "itl_load_p50_ms": percentile(reading, 50),
        "itl_load_p99_ms": percentile(reading, 99),
        "itl_load_max_ms": max(reading, default=0.0),
        "itl_load_tokens": len(reading),
        "loads": len(bigs),
        "load_file_mb": file_mb,
        "load_ms": load_ms,
        "load_finish_ms": reads.finish_ms,
        "loads_late": store.stats()["late_loads"],
        "itl_admit_max_ms": max(admitting, default=0.0),
        "itl_admit_p50_ms": percentile(admitting, 50),
        "itl_p99_ratio": (
            percentile(reading, 99) / percentile(idle, 99) if idle and reading else 0.0
        ),
    }


def _one_load(engine, decoding: _Decoding, reads: _ReadTimes, rid: str, tokens: list) -> dict:
    """One request restoring a large entry file while `decoding` decodes: the decode gaps
    while the file is read, those from the read's end to 3 steps after the loaded
    request's first token (admitting it), the read's ms and the file's MB."""
    from engine.runtime.events import Tokens
    from engine.storage import file_format

    loading: list = []
    plan = _submit(engine, rid, tokens, 2, loading.append)
    t0, n0 = time.perf_counter(), len(decoding.stamps)  # the read starts at the next step
    if not plan.load_from_disk:
        raise RuntimeError("the load request did not restore from disk")
    decoding.until(lambda: reads.read_end and reads.read_end[-1] >= t0)
    load_ms = (reads.read_end[-1] - t0) * 1000
    n1 = len(decoding.stamps)
    decoding.until(lambda: any(isinstance(e, Tokens) for e in loading))
    for _ in range(3):  # the steps just after its first token
        decoding.step()
    gaps = _gaps(decoding.stamps[n0:])
    path = file_format.entry_path(engine.tier.disk_tier.directory, plan.entry_id)
    return {
        "reading": gaps[: n1 - n0 - 1],
        "admitting": gaps[n1 - n0 - 1 :],
        "load_ms": load_ms,
        "file_mb": path.stat().st_size / 1e6,
    }


def _gaps(stamps: list) -> list:
    return [(b - a) * 1000 for a, b in zip(stamps, stamps[1:])]
