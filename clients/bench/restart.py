"""`lineage bench restart`: a warm restart from the disk tier, and what its writer costs.

In one process, on the embedded model (or `--model`), in a cache directory
of its own (a temporary one unless `--cache-dir`):

1. an engine (the server's CacheManager, Generator, RAM tier and disk store,
   no Ray) runs a ~8k-token conversation turn, cold, then a short next turn
   warm from RAM (the reference, and the same kernels warmed), and its writer
   writes the entry files; the engine is dropped;
2. a new engine on the same directory (the restart: the manager scans the
   headers) runs the next turn of that conversation: its time to first token
   (the file read, checksum and copy into MLX included) against the same
   prompt prefilled cold and against the warm turn from RAM;
3. the writer's throughput: copies of the entry written back to back (file
   bytes / wall time, fsyncs included);
4. decode tokens/s of one request while the writer writes a long burst,
   against the same request with the writer idle (interleaved rounds, the
   ratio of their medians, one run);
5. after another restart, decode inter-token latency of one request while
   other requests' restores read large entry files one after another (on the
   reader thread), against the same request's inter-token latency before
   them: p50 and p99 (target: p99 during the loads <= 2x idle). The files are
   written for the phase (`--load-mb`, `--loads`): the conversation's KV rows
   tiled to that size with its state, entries like any other to the disk
   tier, so the loads are long enough for a p99 over many tokens without a
   cold prefill of that length. The steps that then admit each loaded
   request (the rest of the load on the loop thread, the restore, the batch
   merge's copy, its prefill) are reported apart: they are a restore's, from
   RAM as from disk.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from engine.runtime.local import LocalEngine
from engine.storage import file_format
from engine.storage.directory import open_cache_directory
from engine.storage.disk_store import open_disk_store

HELP = "warm restarts from the disk tier: time to first token, writer MB/s, decode under writes"


def add_arguments(parser) -> None:
    parser.add_argument("--model", help="an mlx-lm model directory (default: the embedded one)")
    parser.add_argument("--cache-dir", help="cache directory (default: a temporary one)")
    parser.add_argument("--context", type=int, default=8192, help="conversation length")
    parser.add_argument("--new-tokens", type=int, default=20, help="new tokens of the next turn")
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=256,
        help="tokens decoded for the decode-under-writes figure",
    )
    parser.add_argument("--burst", type=int, default=8, help="entry copies per writer burst")
    parser.add_argument("--rounds", type=int, default=3, help="idle/writing decode rounds")
    parser.add_argument(
        "--load-mb", type=float, default=192.0, help="size of each entry file loaded while decoding"
    )
    parser.add_argument("--loads", type=int, default=3, help="loads while one request decodes")
    parser.add_argument("--json", help="write the figures to this file")


class _Engine(LocalEngine):
    """The in-process engine with the disk tier on: the restart path, as the server runs it."""

    def __init__(self, config, model, tokenizer, info) -> None:
        t0 = time.perf_counter()
        self.directory = open_cache_directory(config.cache, info.fingerprint)
        self.scan_ms = (time.perf_counter() - t0) * 1000
        super().__init__(
            config,
            loaded=(model, tokenizer, info),
            disk_tier=open_disk_store(config, info.fingerprint),
            disk_index=self.directory.index if self.directory else None,
        )

    def close(self) -> None:
        self.tier.disk_tier.close(600)
        if self.directory is not None:
            self.directory.close()


_T0 = time.perf_counter()


def _progress(what: str) -> None:
    """A line on stderr as each phase ends: a run cut short by a time limit still shows
    how far it got and what each phase cost."""
    print(f"[{time.perf_counter() - _T0:7.1f} s] {what}", file=sys.stderr, flush=True)


def _burst(store, entry, record, copies: int, first_id: int) -> None:
    """Queue `copies` writes of one entry under fresh ids."""
    for i in range(copies):
        store.write(entry, dataclasses.replace(record, entry_id=first_id + i))


def run_bench(
    config,
    context: int = 8192,
    new_tokens: int = 20,
    decode_tokens: int = 256,
    copies: int = 8,
    rounds: int = 3,
    load_mb: float = 192.0,
    loads: int = 3,
    seed: int = 0,
) -> dict:
    import numpy as np

    from engine.runtime.loader import load_model

    loaded = load_model(config)
    info = loaded[2]
    rng = np.random.default_rng(seed)

    def draw(n: int) -> list:
        return [int(t) for t in rng.integers(10, info.vocab_size - 10, size=n)]

    first = _Engine(config, *loaded)
    first.run(draw(300), max_tokens=2, namespace="warmup")  # MLX kernels
    prompt = draw(context)
    cold = first.run(prompt, max_tokens=4)
    convo = prompt + cold.ids + draw(new_tokens)
    in_ram = first.run(convo, max_tokens=4)
    first.tier.disk_tier.flush(600)
    written = first.tier.disk_tier.stats()["writer"]
    first.close()
    _progress(f"phase 1: {len(convo)}-token conversation cold, then warm from RAM")

    second = _Engine(config, *loaded)  # the restart
    turn = convo + in_ram.ids + draw(new_tokens)
    after = second.run(turn, max_tokens=4)
    if not after.plan.load_from_disk or after.final.restore_length == 0:
        raise RuntimeError(f"the turn after the restart did not restore from disk: {after.final}")
    cold_same = second.run(turn, max_tokens=4, cold=True)
    _progress(f"phase 2: restart ttft {after.ttft_ms:.0f} ms, cold {cold_same.ttft_ms:.0f} ms")
    writer = _writer_figures(config, second, after, draw(64), copies, rounds, decode_tokens)
    _progress("phases 3-4: writer throughput, decode while writing")
    bigs = _big_entries(second, after.plan.new_entry_id, load_mb, loads, draw)
    second.close()
    _progress(f"phase 5, set-up: {len(bigs)} entry files of {load_mb:.0f} MB written")
    third = _Engine(config, *loaded)  # restarted again: the entries are on disk only
    during_load = _decode_during_load(third, draw(64), bigs, draw)
    third.close()
    _progress("phase 5: decode during the loads")

    out = {
        "model": info.path,
        "context_tokens": len(turn),
        "file_bytes": written["bytes"] // max(1, written["files"]),
        "scan_ms": second.scan_ms,
        "restart_ttft_ms": after.ttft_ms,
        "restart_restore_ms": after.final.timing.restore_ms,
        "restart_prefill_ms": after.final.timing.prefill_ms,
        "restart_cached_tokens": after.final.cached_tokens,
        "cold_ttft_ms": cold_same.ttft_ms,
        "ram_ttft_ms": in_ram.ttft_ms,
        "first_cold_ttft_ms": cold.ttft_ms,
        **writer,
        **during_load,
    }
    out["cold_to_restart"] = out["cold_ttft_ms"] / out["restart_ttft_ms"]
    out["decode_ratio"] = out["decode_tps_writing"] / out["decode_tps_idle"]
    return out


def _big_entries(engine, entry_id: int, target_mb: float, count: int, draw) -> list:
    """Write `count` large entry files beside the real ones: the held entry's KV rows tiled
    to about `target_mb` MB, its state at the new length, fresh token ids. To the disk
    tier they are entries like any other (format, checks, load path): what a long
    conversation would leave, without prefilling one cold. Their token lists."""
    import mlx.core as mx
    from mlx.utils import tree_map

    from engine.cache.messages import EntryRecord
    from engine.runtime import layer_caches
    from engine.runtime.ram_tier import StoredEntry

    held = engine.tier.entries[entry_id]
    n = held.length
    per_token = layer_caches.kv_bytes_per_token(held.layers)
    reps = max(1, round(target_mb * 1e6 / (per_token * n)))

    def tile(layer):
        if isinstance(layer, layer_caches.StoredList):
            return layer_caches.StoredList(tuple(tile(p) for p in layer.parts))
        if not isinstance(layer, layer_caches.StoredKV) or layer.keys is None:
            return layer
        kv = tree_map(
            lambda a: mx.concatenate([a[..., :n, :]] * reps, axis=-2), (layer.keys, layer.values)
        )
        return layer_caches.StoredKV(*kv, n * reps, layer.quant)

    layers = [tile(layer) for layer in held.layers]
    mx.eval(list(layer_caches._arrays(layers)))
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


def _decode_during_load(engine, short: list, bigs: list, draw) -> dict:
    """Inter-token latency (ms) of a decoding request, idle and while other requests'
    restores read large entry files on the reader thread, one after another; then the
    steps that admit each loaded request (the finish on the loop thread, the restore,
    the batch merge's copy, its prefill), apart."""
    from engine.cache.messages import PlanRequest
    from engine.runtime.events import Finished, Tokens
    from engine.runtime.requests import GenerationRequest, SamplingParams

    gen, store = engine.generator, engine.tier.disk_tier
    read_end: list = []
    finish_ms: list = []
    start_read, finish = store.start_read, store.finish

    def timed_read(entry_id):
        future = start_read(entry_id)
        future.add_done_callback(lambda f: read_end.append(time.perf_counter()))
        return future

    def timed_finish(*args, **kwargs):  # on the loop thread
        t0 = time.perf_counter()
        try:
            return finish(*args, **kwargs)
        finally:
            finish_ms.append((time.perf_counter() - t0) * 1000)

    store.start_read, store.finish = timed_read, timed_finish
    stamps: list = []

    def submit(rid: str, tokens: list, max_tokens: int, on_event):
        plan = engine.manager.plan(PlanRequest(rid, np.asarray(tokens, np.int32)))
        req = GenerationRequest(
            rid, "", tuple(tokens), plan, SamplingParams(max_tokens), time.time(), 0.0
        )
        gen.submit(req, on_event)
        return plan

    def decoding(event) -> None:
        if isinstance(event, Tokens):
            stamps.append(time.perf_counter())
        elif isinstance(event, Finished):
            ended.append(event)

    def step() -> None:
        if ended:  # its gaps would stop, and the windows below would wait for ever
            raise RuntimeError(f"the decoding request ended: {ended[0]}")
        gen.step()

    # The decoding request must outlast every window: the tiny model's greedy tokens
    # reach an EOS sooner or later (a run then spun for ever), so none stops it here.
    gen.eos_ids, ended = frozenset(), []
    submit("itl-decode", short, 1 << 20, decoding)
    while len(stamps) < 20:  # warm-up
        step()
    idle, reading, admitting, load_ms, file_mb = [], [], [], [], []
    for i, tokens in enumerate(bigs):
        n0 = len(stamps)  # idle just before each load: both see the same machine
        while len(stamps) < n0 + IDLE_TOKENS:
            step()
        idle += _gaps(stamps[n0:])
        loading: list = []
        plan = submit(f"itl-load-{i}", tokens + draw(16), 2, loading.append)
        t0, n0 = time.perf_counter(), len(stamps)  # the read starts at the next step
        if not plan.load_from_disk:
            raise RuntimeError("the load request did not restore from disk")
        while not read_end or read_end[-1] < t0:
            step()
        load_ms.append((read_end[-1] - t0) * 1000)
        n1 = len(stamps)
        while not any(isinstance(e, Tokens) for e in loading):
            step()
        for _ in range(3):  # the steps just after its first token
            step()
        gaps = _gaps(stamps[n0:])
        reading += gaps[: n1 - n0 - 1]
        admitting += gaps[n1 - n0 - 1 :]
        path = file_format.entry_path(store.directory, plan.entry_id)
        file_mb.append(path.stat().st_size / 1e6)
        _progress(
            f"  load {i}: {file_mb[-1]:.0f} MB in {load_ms[-1]:.0f} ms; gaps while reading "
            f"max {max(gaps[: n1 - n0 - 1], default=0):.1f} ms over {n1 - n0 - 1}, "
            f"idle before p99 {np.percentile(idle[-IDLE_TOKENS + 1 :], 99):.2f} ms"
        )
        for _ in range(20):  # the loaded request done, before the next idle window
            step()
    gen.cancel("itl-decode")
    while gen.busy or gen.pending:
        gen.step()
    store.start_read, store.finish = start_read, finish
    late = store.stats()["late_loads"]
    p = lambda xs, q: float(np.percentile(xs, q)) if xs else 0.0  # noqa: E731
    return {
        "itl_idle_p50_ms": p(idle, 50),
        "itl_idle_p99_ms": p(idle, 99),
        "itl_idle_tokens": len(idle),
        "itl_load_p50_ms": p(reading, 50),
        "itl_load_p99_ms": p(reading, 99),
        "itl_load_max_ms": max(reading, default=0.0),
        "itl_load_tokens": len(reading),
        "loads": len(bigs),
        "load_file_mb": file_mb,
        "load_ms": load_ms,
        "load_finish_ms": finish_ms,
        "loads_late": late,
        "itl_admit_max_ms": max(admitting, default=0.0),
        "itl_admit_p50_ms": p(admitting, 50),
        "itl_p99_ratio": p(reading, 99) / p(idle, 99) if idle and reading else 0.0,
    }


IDLE_TOKENS = 150  # inter-token gaps measured idle before each load


def _gaps(stamps: list) -> list:
    return [(b - a) * 1000 for a, b in zip(stamps, stamps[1:])]


def _writer_figures(config, engine, after, short, copies, rounds, decode_tokens) -> dict:
    """The writer's MB/s on a burst of copies of the restored entry, and decode tokens/s
    while it writes against idle (interleaved rounds, medians), in a directory of its own."""
    from engine.cache.disk_index import record
    from engine.storage.disk_store import DiskStore

    entry_id = after.plan.new_entry_id
    entry = engine.tier.entries[entry_id]
    rec = record(engine.manager.index.get(entry_id))
    burst_dir = Path(config.cache.resolved_cache_dir) / "bench-burst"
    store = DiskStore(burst_dir, engine.info.fingerprint)
    t0 = time.perf_counter()
    _burst(store, entry, rec, copies, 1)
    store.flush(600)
    burst_s = time.perf_counter() - t0
    burst_bytes = store.stats()["writer"]["bytes"]

    idle, busy, busy_throughout = [], [], True
    for k in range(rounds):
        r = engine.run(short, max_tokens=decode_tokens, namespace=f"decode-idle-{k}")
        idle.append(r.final.timing.decode_tps)
        first_id = 10_000 * (k + 1)
        _burst(store, entry, rec, copies * 50, first_id)  # more than the decode lasts
        r = engine.run(short, max_tokens=decode_tokens, namespace=f"decode-busy-{k}")
        busy.append(r.final.timing.decode_tps)
        busy_throughout &= store.writer.backlog[0] > 0
        for i in range(copies * 50):
            store.delete(first_id + i)  # drop what is still queued
        store.flush(600)
    store.close(600)
    shutil.rmtree(burst_dir, ignore_errors=True)
    return {
        "writer_mb_per_s": burst_bytes / burst_s / 1e6,
        "writer_files": copies,
        "decode_tps_idle": statistics.median(idle),
        "decode_tps_writing": statistics.median(busy),
        "decode_rounds": rounds,
        "writer_still_busy_after_decode": busy_throughout,
    }


def report(out: dict) -> str:
    busy = (
        ""
        if out["writer_still_busy_after_decode"]
        else ("  (the writer finished before the decode did)")
    )
    lines = [
        f"model                  {out['model']}",
        (
            f"context                {out['context_tokens']} tokens; entry file "
            f"{out['file_bytes'] / 1e6:.1f} MB"
        ),
        f"restart                header scan {out['scan_ms']:.1f} ms",
        (
            f"ttft after restart     {out['restart_ttft_ms']:.1f} ms  (file load "
            f"{out['restart_restore_ms']:.1f} ms, prefill {out['restart_prefill_ms']:.1f} ms, "
            f"{out['restart_cached_tokens']} tokens cached)"
        ),
        (
            f"ttft cold              {out['cold_ttft_ms']:.1f} ms  "
            f"({out['cold_to_restart']:.1f}x the restart's)"
        ),
        f"ttft warm in RAM       {out['ram_ttft_ms']:.1f} ms  (the turn before the restart)",
        (
            f"writer                 {out['writer_mb_per_s']:.0f} MB/s "
            f"({out['writer_files']} files back to back, fsync each)"
        ),
        (
            f"decode                 {out['decode_tps_writing']:.0f} tok/s while writing, "
            f"{out['decode_tps_idle']:.0f} idle: ratio {out['decode_ratio']:.2f} "
            f"(medians of {out['decode_rounds']} interleaved rounds){busy}"
        ),
        (
            f"decode during a load   inter-token p50/p99 {out['itl_load_p50_ms']:.2f}/"
            f"{out['itl_load_p99_ms']:.2f} ms (max {out['itl_load_max_ms']:.2f}) over "
            f"{out['itl_load_tokens']} tokens while {out['loads']} entry files of "
            f"{_join(out['load_file_mb'], '.0f')} MB loaded "
            f"({_join(out['load_ms'], '.0f')} ms; {out['loads_late']} finished late), "
            f"idle {out['itl_idle_p50_ms']:.2f}/"
            f"{out['itl_idle_p99_ms']:.2f} ms over {out['itl_idle_tokens']} tokens: "
            f"p99 ratio {out['itl_p99_ratio']:.2f} (target <= 2)"
        ),
        (
            f"  then admitting each  loop-thread finish {_join(out['load_finish_ms'], '.1f')} "
            f"ms; inter-token p50/max {out['itl_admit_p50_ms']:.1f}/"
            f"{out['itl_admit_max_ms']:.1f} ms from the read's end to 3 steps after its "
            f"first token (restore, batch merge copy, prefill: as from RAM)"
        ),
    ]
    return "\n".join(lines)


def _join(xs: list, fmt: str) -> str:
    return ", ".join(format(x, fmt) for x in xs)


def run(args) -> int:
    from engine.config import CacheConfig, EngineConfig, ModelConfig

    root = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="lineage-"))
    try:
        config = EngineConfig(
            model=ModelConfig(path=args.model),
            cache=CacheConfig(cache_dir=str(root), ram_budget=8 << 30),
        )
        out = run_bench(
            config,
            args.context,
            args.new_tokens,
            args.decode_tokens,
            args.burst,
            args.rounds,
            args.load_mb,
            args.loads,
        )
    finally:
        if not args.cache_dir:
            shutil.rmtree(root, ignore_errors=True)
    print(report(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0
