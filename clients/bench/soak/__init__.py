"""`lineage bench soak --minutes M`: a day of agent traffic against a real `lineage serve`.

It starts `lineage serve` (Ray, the model actor, the cache manager, gRPC and the
HTTP bridge; clients.bench.soak.serve) on the embedded model (or `--model`)
with a RAM and a disk budget small enough that eviction, thinning and disk
writes run all the time, and a compiled-grammar cache smaller than the tool
sets the rounds use in turn, so grammars are compiled and dropped all the time
too, in a cache directory of its own, and for `--minutes`
drives it over HTTP with agent-shaped users (clients.bench.soak.users: rounds
of sub-agent bursts, long coding sessions that grow and compact, edits,
regenerates, cancelled streams, slow readers, idle gaps; chat completions,
Anthropic Messages and Responses mixed), while fixed greedy probes are checked
against their first reply. Faults run on a schedule (clients.bench.soak.faults:
the model actor and the cache manager killed, the disk full for a window, a
client hanging up mid-prefill, and one SIGTERM and restart of the whole
server in the middle that must come back warm). Every `--sample-every` seconds
a sample (clients.bench.soak.samples) is appended to `--samples` as a JSON
line, as the run goes.

At the end the traffic stops, the writers flush, the disk index is read, the
server is stopped with SIGTERM, and the files left in the cache directory are
compared with the index (orphaned: a file the index does not hold, or a
temporary file left behind). The report (clients.bench.soak.report): each
process's RSS slope after warm-up, the disk's peak against its budget, fds and
threads first and last, time to first token per window with the load,
errors by kind, wrong replies, orphaned files, and the bounds each figure is
held to; `--plot` draws memory, disk and time to first token over time.
Exit status 1 when a bound is not met. With `--heap-trace-at A,B` the front
end traces its heap and the report compares its snapshots A and B minutes into
each life by line (clients.bench.soak.heap): Python's heap or native memory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from clients.bench.figures import emit, plot_ready

DISK_ROOM = 3  # the cache directory's filesystem holds this many disk budgets
HELP = "soak: a real serve under agent traffic and faults for M minutes; what grows, what drifts"


def add_arguments(parser) -> None:
    from clients.bench.soak.faults import ALL

    parser.add_argument("--minutes", type=float, default=60.0, help="how long the traffic runs")
    parser.add_argument("--model", help="an mlx-lm model directory (default: the embedded one)")
    parser.add_argument("--work-dir", help="cache directory, log and samples (default: a temp)")
    parser.add_argument("--ram-budget", default="8M", help="the RAM tier's budget (small)")
    parser.add_argument("--disk-budget", default="48M", help="the disk tier's budget (small)")
    parser.add_argument("--scale", type=float, default=0.1, help="agent traffic scale")
    parser.add_argument("--agents", type=int, default=3, help="sub-agents of a burst")
    parser.add_argument(
        "--tool-sets",
        type=int,
        default=16,
        help="distinct tool sets the rounds draw from in turn (0: new tools every round)",
    )
    parser.add_argument(
        "--grammar-cache",
        type=int,
        default=8,
        help="the serve's compiled grammars kept (small: fewer than --tool-sets)",
    )
    parser.add_argument("--long-sessions", type=int, default=2, help="long coding sessions")
    parser.add_argument("--compact-at", type=int, default=2500, help="tokens before compaction")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds")
    parser.add_argument("--warmup", type=float, help="minutes (default: a fifth, at most 5)")
    parser.add_argument("--window", type=float, help="report window, minutes (default: M/12)")
    parser.add_argument("--faults", default=",".join(ALL), help="which (restart: once)")
    parser.add_argument("--fault-every", type=float, default=240.0, help="seconds between")
    parser.add_argument("--disk-full", type=float, default=8.0, help="seconds of ENOSPC")
    parser.add_argument("--disconnect-words", type=int, default=3000, help="its prompt")
    parser.add_argument("--disconnect-after", type=float, default=0.3, help="seconds")
    parser.add_argument("--recovery", type=float, default=240.0, help="seconds to recover")
    parser.add_argument("--probe-every", type=float, default=20.0, help="seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", help="the JSON lines (default: WORK_DIR/samples.jsonl)")
    parser.add_argument(
        "--heap-trace-at",
        help="A,B: trace the front end's heap; compare snapshots A and B minutes into each life",
    )
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--plot", help="write the figure (PNG, matplotlib)")


class Soak:
    """The running soak: its serve, its cache directory's filesystem, the users' log."""

    def __init__(self, args, work: Path):
        from clients.bench.harness import model_path
        from clients.bench.soak.disk import SmallDisk
        from clients.bench.soak.serve import Serve
        from clients.bench.soak.users import Log, Probes
        from engine.config import parse_bytes
        from engine.storage.file_format import entries_dir

        self.args, self.work = args, work
        self.cache_dir = work / "cache"
        self.entries = entries_dir(self.cache_dir)
        self.disk_budget = parse_bytes(args.disk_budget)
        self.disk = SmallDisk(self.cache_dir, DISK_ROOM * self.disk_budget)
        flags = ["--model", model_path(args.model), "--ram-budget", args.ram_budget]
        flags += ["--disk-budget", args.disk_budget, "--replicas", "1"]
        flags += ["--grammar-cache", str(args.grammar_cache)]
        self.serve = Serve(work, self.cache_dir, flags, f"lineage-soak-{os.getpid()}")
        self.log = Log(time.monotonic())
        self.halt, self.stopping = threading.Event(), threading.Event()
        self.probes = Probes(max_tokens=args.max_tokens)
        self.schedule = None
        self.client = None
        self.sample_errors: list[str] = []
        self.heap = None  # clients.bench.soak.heap.HeapTrace with --heap-trace-at
        if args.heap_trace_at:
            from clients.bench.soak.heap import HeapTrace

            at = [float(x) for x in args.heap_trace_at.split(",")]
            self.heap = HeapTrace(self.serve, at, (work / "heap").resolve(), self.halt)
            self.serve.env.update(self.heap.environment())


def run(args) -> int:
    if not plot_ready(args, "lineage bench soak"):
        return 1
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="lineage-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    soak = Soak(args, work)
    soak.disk.mount()
    try:
        figures = _soak(soak, args)
    finally:
        soak.serve.kill()
        soak.disk.unmount()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    from clients.bench.figures import write_json
    from clients.bench.soak.report import format_report, plot

    write_json(work / "report.json" if args.work_dir else args.json or os.devnull, figures)
    emit(figures, args, format_report, plot)
    return 0 if figures["verdict"]["ok"] else 1


def _soak(soak: Soak, args) -> dict:
    from clients.bench.soak import faults, report
    from clients.bench.soak.samples import Sampler
    from clients.bench.soak.users import LongSession, Rounds
    from clients.client import Client

    seconds = args.minutes * 60
    samples = Path(args.samples or soak.work / "samples.jsonl")
    kinds = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(kinds) - set(faults.ALL))
    if unknown:
        raise SystemExit(f"lineage bench soak: unknown faults {unknown}; known: {faults.ALL}")
    planned = faults.plan(
        seconds, args.fault_every, [k for k in kinds if k != "restart"], "restart" in kinds
    )
    started = soak.serve.start()
    print(f"lineage bench soak: serving after {started:.1f} s; samples in {samples}", flush=True)
    if soak.disk.why:
        print(f"lineage bench soak: {soak.disk.why}: the disk is never full", flush=True)
    soak.client = Client(soak.serve.address, timeout=300)
    soak.log.t0 = time.monotonic()
    soak.probes.run(soak.client, soak.log)  # the reference replies, on a fresh server
    sampler = Sampler(soak, samples, args.sample_every)
    soak.schedule = faults.Schedule(soak, planned, args)
    url = soak.serve.url
    users = [
        Rounds(
            url,
            soak.log,
            soak.halt,
            args.seed,
            args.scale,
            args.agents,
            args.max_tokens,
            args.tool_sets,
        )
    ] + [
        LongSession(
            i, url, soak.log, soak.halt, args.seed, args.scale, args.max_tokens, args.compact_at
        )
        for i in range(args.long_sessions)
    ]
    sampler.start()
    soak.schedule.start()
    if soak.heap is not None:
        soak.heap.start()
    for user in users:
        user.start()
    while soak.log.now() < seconds or not soak.schedule.done.is_set():
        time.sleep(min(args.probe_every, 1.0) if soak.stopping.is_set() else args.probe_every)
        if not soak.stopping.is_set():
            soak.probes.run(soak.client, soak.log)
    soak.halt.set()
    for user in users:
        user.join(300)
    soak.schedule.join(60)
    final = _final_stop(soak)
    sampler.stop()
    soak.sample_errors = sampler.errors
    soak.client.close()
    figures = report.figures(
        sampler.samples, soak.log.events, soak.schedule.results, soak.probes, final, soak, args
    )
    if soak.heap is not None:
        soak.heap.join(5)
        try:
            lives = soak.heap.growth()
        except Exception as e:  # the snapshots stay in WORK_DIR/heap; the report goes on
            lives = []
            soak.heap.errors.append(f"{type(e).__name__}: {e}")
        figures["heap"] = {"lives": lives, "errors": soak.heap.errors}
    return figures


def _final_stop(soak: Soak) -> dict:
    """Once the writes have settled (the engine's count of its disk tier the files' bytes,
    or a minute gone), stop the server with SIGTERM, then compare the files left with what
    the engine last counted: a file beyond its count is orphaned, a temporary file left."""
    from clients.bench.soak.samples import read_disk
    from engine.storage.file_format import TEMP_NAME

    deadline, stats = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        stats = soak.client.cache_stats()
        if stats.get("disk_bytes") == read_disk(soak.entries)["bytes"]:
            break
        time.sleep(1.0)
    soak.stopping.set()
    stopped = soak.serve.stop()
    names = sorted(os.listdir(soak.entries)) if soak.entries.is_dir() else []
    disk = read_disk(soak.entries)
    counted = stats.get("disk_entries", 0)
    return {
        "stop": stopped,
        "files": disk["files"],
        "counted": counted,
        "orphaned": max(0, disk["files"] - counted),
        "temps_left": [n for n in names if TEMP_NAME.match(n)],
        "disk": disk,
        "stats_disk_bytes": stats.get("disk_bytes"),
        # the files' bytes against the engine's count of them: the budget holds the disk
        # only where the two agree
        "bytes_gap": disk["bytes"] - (stats.get("disk_bytes") or 0),
        "cache": {
            k: stats.get(k, 0)
            for k in ("evictions", "disk_writes_lost", "restores_lost", "damaged_files")
        },
    }


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="lineage bench soak", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
