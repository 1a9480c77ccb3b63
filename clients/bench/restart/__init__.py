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

Cheap to import: MLX and the engine's runtime and storage load inside `run`.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from clients.bench.figures import emit, labelled, median
from clients.bench.harness import add_engine_arguments, bench_kernels, cache_dir
from clients.bench.restart.loads import big_entries, decode_during_load

HELP = "warm restarts from the disk tier: time to first token, writer MB/s, decode under writes"


def add_arguments(parser) -> None:
    add_engine_arguments(parser)
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


@dataclasses.dataclass
class DiskEngine:
    """The in-process engine with the disk tier on: the restart path, as the server runs it.

    `local` is the LocalEngine; `scan_ms` what opening the cache directory (reading every
    entry file's header) took before it started.
    """

    local: object
    directory: object
    scan_ms: float

    @classmethod
    def start(cls, config, loaded) -> "DiskEngine":
        from engine.runtime.local import LocalEngine
        from engine.storage.directory import open_cache_directory
        from engine.storage.disk_store import open_disk_store

        info = loaded[2]
        t0 = time.perf_counter()
        directory = open_cache_directory(config.cache, info.fingerprint)
        scan_ms = (time.perf_counter() - t0) * 1000
        local = LocalEngine(
            config,
            loaded=loaded,
            disk_tier=open_disk_store(config, info.fingerprint),
            disk_index=directory.index if directory else None,
        )
        return cls(local, directory, scan_ms)

    def close(self) -> None:
        self.local.tier.disk_tier.close(600)
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
    from engine.runtime.model.loader import load_model

    loaded = load_model(config)
    info = loaded[2]
    rng = np.random.default_rng(seed)

    def draw(n: int) -> list:
        return [int(t) for t in rng.integers(10, info.vocab_size - 10, size=n)]

    first = DiskEngine.start(config, loaded)
    cold, in_ram, convo, written = _before_restart(first, draw, context, new_tokens)
    second = DiskEngine.start(config, loaded)  # the restart
    turn = convo + in_ram.ids + draw(new_tokens)
    after = second.local.run(turn, max_tokens=4)
    if not after.plan.load_from_disk or after.final.restore_length == 0:
        raise RuntimeError(f"the turn after the restart did not restore from disk: {after.final}")
    cold_same = second.local.run(turn, max_tokens=4, cold=True)
    _progress(f"phase 2: restart ttft {after.ttft_ms:.0f} ms, cold {cold_same.ttft_ms:.0f} ms")
    writer = _writer_figures(config, second.local, after, draw(64), copies, rounds, decode_tokens)
    _progress("phases 3-4: writer throughput, decode while writing")
    bigs = big_entries(second.local, after.plan.new_entry_id, load_mb, loads, draw)
    second.close()
    _progress(f"phase 5, set-up: {len(bigs)} entry files of {load_mb:.0f} MB written")
    third = DiskEngine.start(config, loaded)  # restarted again: the entries are on disk only
    during_load = decode_during_load(third.local, draw(64), bigs, draw, _progress)
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


def _before_restart(first: DiskEngine, draw, context: int, new_tokens: int) -> tuple:
    """Phase 1: a conversation's turn cold, then its next turn warm from RAM, the entry files
    written; the engine closed. (cold result, warm result, the conversation, writer figures)"""
    engine = first.local
    engine.run(draw(300), max_tokens=2, namespace="warmup")  # MLX kernels
    prompt = draw(context)
    cold = engine.run(prompt, max_tokens=4)
    convo = prompt + cold.ids + draw(new_tokens)
    in_ram = engine.run(convo, max_tokens=4)
    engine.tier.disk_tier.flush(600)
    written = engine.tier.disk_tier.stats()["writer"]
    first.close()
    _progress(f"phase 1: {len(convo)}-token conversation cold, then warm from RAM")
    return cold, in_ram, convo, written


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
        "decode_tps_idle": median(idle),
        "decode_tps_writing": median(busy),
        "decode_rounds": rounds,
        "writer_still_busy_after_decode": busy_throughout,
    }


def report(out: dict) -> str:
    busy = (
        ""
        if out["writer_still_busy_after_decode"]
        else "  (the writer finished before the decode did)"
    )
    rows = [
        ("model", out["model"]),
        (
            "context",
            f"{out['context_tokens']} tokens; entry file {out['file_bytes'] / 1e6:.1f} MB",
        ),
        ("restart", f"header scan {out['scan_ms']:.1f} ms"),
        (
            "ttft after restart",
            f"{out['restart_ttft_ms']:.1f} ms  (file load {out['restart_restore_ms']:.1f} ms, "
            f"prefill {out['restart_prefill_ms']:.1f} ms, "
            f"{out['restart_cached_tokens']} tokens cached)",
        ),
        (
            "ttft cold",
            f"{out['cold_ttft_ms']:.1f} ms  ({out['cold_to_restart']:.1f}x the restart's)",
        ),
        ("ttft warm in RAM", f"{out['ram_ttft_ms']:.1f} ms  (the turn before the restart)"),
        (
            "writer",
            f"{out['writer_mb_per_s']:.0f} MB/s ({out['writer_files']} files back to back, "
            f"fsync each)",
        ),
        (
            "decode",
            f"{out['decode_tps_writing']:.0f} tok/s while writing, "
            f"{out['decode_tps_idle']:.0f} idle: ratio {out['decode_ratio']:.2f} "
            f"(medians of {out['decode_rounds']} interleaved rounds){busy}",
        ),
        (
            "decode during a load",
            f"inter-token p50/p99 {out['itl_load_p50_ms']:.2f}/"
            f"{out['itl_load_p99_ms']:.2f} ms (max {out['itl_load_max_ms']:.2f}) over "
            f"{out['itl_load_tokens']} tokens while {out['loads']} entry files of "
            f"{_join(out['load_file_mb'], '.0f')} MB loaded "
            f"({_join(out['load_ms'], '.0f')} ms; {out['loads_late']} finished late), "
            f"idle {out['itl_idle_p50_ms']:.2f}/"
            f"{out['itl_idle_p99_ms']:.2f} ms over {out['itl_idle_tokens']} tokens: "
            f"p99 ratio {out['itl_p99_ratio']:.2f} (target <= 2)",
        ),
        (
            "  then admitting each",
            f"loop-thread finish {_join(out['load_finish_ms'], '.1f')} "
            f"ms; inter-token p50/max {out['itl_admit_p50_ms']:.1f}/"
            f"{out['itl_admit_max_ms']:.1f} ms from the read's end to 3 steps after its "
            f"first token (restore, batch merge copy, prefill: as from RAM)",
        ),
    ]
    return "\n".join(labelled(rows, 23))


def _join(xs: list, fmt: str) -> str:
    return ", ".join(format(x, fmt) for x in xs)


def run(args) -> int:
    from engine.config import CacheConfig, EngineConfig, ModelConfig

    with cache_dir(args.cache_dir, "restart") as root:
        config = EngineConfig(
            model=ModelConfig(path=args.model),
            cache=CacheConfig(cache_dir=str(root), ram_budget=8 << 30),
            kernels=bench_kernels(),
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
    return emit(out, args, report)
