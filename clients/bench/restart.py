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
5. after another restart, decode inter-token latency of one request while a
   second request's restore reads the largest entry's file (on the reader
   thread), against the same request's inter-token latency before the load:
   p50 and p99 (target: p99 during the load <= 2x idle).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from engine.runtime.local import LocalEngine
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

    second = _Engine(config, *loaded)  # the restart
    turn = convo + in_ram.ids + draw(new_tokens)
    after = second.run(turn, max_tokens=4)
    if not after.plan.load_from_disk or after.final.restore_length == 0:
        raise RuntimeError(f"the turn after the restart did not restore from disk: {after.final}")
    cold_same = second.run(turn, max_tokens=4, cold=True)
    writer = _writer_figures(config, second, after, draw(64), copies, rounds, decode_tokens)
    second.close()
    third = _Engine(config, *loaded)  # restarted again: the entry is on disk only
    during_load = _decode_during_load(third, draw(64), turn, decode_tokens)
    third.close()

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


def _decode_during_load(engine, short: list, turn: list, decode_tokens: int) -> dict:
    """Inter-token latency (ms) of a decoding request before and while another request's
    restore reads the largest entry's file on the reader thread."""
    import numpy as np

    from engine.cache.messages import PlanRequest
    from engine.runtime.events import Finished, Tokens
    from engine.runtime.requests import GenerationRequest, SamplingParams

    gen = engine.generator
    stamps: list = []
    done: list = []

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
        done.append(isinstance(event, Finished))

    submit("itl-decode", short, decode_tokens, decoding)
    while len(stamps) < decode_tokens // 2:
        gen.step()
    idle_until = len(stamps)
    loading: list = []
    plan = submit("itl-load", turn, 2, loading.append)
    if not plan.load_from_disk:
        raise RuntimeError("the load request did not restore from disk")
    window = [time.perf_counter(), None]
    while not any(done):
        gen.step()
        if window[1] is None and any(isinstance(e, Tokens) for e in loading):
            window[1] = time.perf_counter()
    while gen.busy or gen.pending:
        gen.step()
    gaps = [(b - a) * 1000 for a, b in zip(stamps, stamps[1:])]
    idle = gaps[: idle_until - 1][2:]  # after the first few (warm-up)
    start, end = window[0], window[1] or stamps[-1]
    during = [g for (a, b), g in zip(zip(stamps, stamps[1:]), gaps) if b >= start and a <= end]
    p = lambda xs, q: float(np.percentile(xs, q)) if xs else 0.0  # noqa: E731
    return {
        "itl_idle_p50_ms": p(idle, 50),
        "itl_idle_p99_ms": p(idle, 99),
        "itl_load_p50_ms": p(during, 50),
        "itl_load_p99_ms": p(during, 99),
        "itl_load_tokens": len(during),
        "load_window_ms": (end - start) * 1000,
        "itl_p99_ratio": p(during, 99) / p(idle, 99) if idle and during else 0.0,
    }


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
            f"decode during a load   inter-token p50/p99 {out['itl_load_p50_ms']:.1f}/"
            f"{out['itl_load_p99_ms']:.1f} ms over {out['itl_load_tokens']} tokens while the "
            f"largest entry loaded ({out['load_window_ms']:.0f} ms), idle "
            f"{out['itl_idle_p50_ms']:.1f}/{out['itl_idle_p99_ms']:.1f} ms: p99 ratio "
            f"{out['itl_p99_ratio']:.2f} (target <= 2)"
        ),
    ]
    return "\n".join(lines)


def run(args) -> int:
    from engine.config import CacheConfig, EngineConfig, ModelConfig

    root = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="lineage-"))
    try:
        config = EngineConfig(
            model=ModelConfig(path=args.model),
            cache=CacheConfig(cache_dir=str(root), ram_budget=8 << 30),
        )
        out = run_bench(
            config, args.context, args.new_tokens, args.decode_tokens, args.burst, args.rounds
        )
    finally:
        if not args.cache_dir:
            shutil.rmtree(root, ignore_errors=True)
    print(report(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0
