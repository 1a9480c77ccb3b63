"""`lineage bench faults`: the cache under faults, on 2 replicas under agent traffic.

It starts a Ray of its own and a real engine (2 model replicas, the cache
manager, gRPC on a free port) on the embedded model (or `--model`), with a
small RAM budget (entries go to disk and come back), a low route threshold
(handovers between the replicas), a 2 s loop deadline and a cache directory
of its own. Agent traffic (clients.bench.agents.traffic: sub-agents sharing a system
prompt, tool calls, edits, regenerates, dropped streams) runs through it round
after round, while it injects, one at a time (clients.bench.faults.injection):

1. `manager`: SIGKILL of the cache manager's process (Ray restarts it);
2. `replica`: SIGKILL of replica 1's process (Ray restarts it);
3. `stall`: replica 0's model loop sleeps 1.5 loop deadlines: one missed ping,
   so the replica is lost, then answers and is reset;
4. `disk`: every replica's writer meets ENOSPC for `--disk-full` seconds (the
   write call fails as on a full disk; nothing fills the real disk).

A fault is survived when, within `--recovery` seconds, the engine serves a
request again and shows the fault's own mark (a new incarnation, a reset that
was not a kill, lost writes reported then files written again). Every second
it checks (clients.bench.faults.checks) the manager's invariants, that each
replica's RAM tier holds what the index places there at the index's bytes,
and that the directory holds the disk index; findings that last
`--lasting` checks in a row count. When the traffic is done and the writers
have flushed, the same check runs strictly.

A fault-free engine then replays every prompt the faulted run sent, in the
same steps at the same concurrency, at temperature 0: every reply completed
in both runs must be the same tokens. Figures: faults survived, requests
(completed, failed, retried), wrong replies (must be 0), leaked bytes (RAM
the index does not place, and the disk budget's bytes against the files' once
the writers flushed: clients.bench.disk_leak) and orphaned files (must be 0),
restores lost, token mismatches, and what the token check costs per restore.
Exit status 1 unless every fault was survived and wrong replies, leaked
bytes, orphaned files and invariant violations are 0.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from clients.bench.figures import emit
from clients.bench.harness import add_engine_arguments, cache_dir, kernel_set, own_ray

HELP = "faults: kill the manager and a replica, stall a loop, fill the disk, under agent traffic"
FAULTS = ("manager", "replica", "stall", "disk")


def add_arguments(parser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--scale", type=float, default=0.1, help="traffic scale (prefix size)")
    parser.add_argument("--agents", type=int, default=2, help="concurrent sub-agents")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply")
    parser.add_argument("--ram-budget", default="8M", help="the RAM tier's budget (small)")
    parser.add_argument(
        "--route-threshold", type=int, default=0, help="queued tokens (0: any imbalance hands over)"
    )
    parser.add_argument("--loop-deadline", type=float, default=2.0, help="seconds")
    parser.add_argument("--gap", type=float, default=8.0, help="seconds between faults")
    parser.add_argument("--disk-full", type=float, default=6.0, help="seconds of ENOSPC")
    parser.add_argument("--recovery", type=float, default=180.0, help="seconds to recover")
    parser.add_argument("--lasting", type=int, default=20, help="checks a finding must last")
    parser.add_argument("--max-rounds", type=int, default=12, help="traffic rounds at most")
    parser.add_argument("--faults", default=",".join(FAULTS), help="which, in order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures to this file")


@dataclass
class Sent:
    """One request of the faulted run, as sent and as answered."""

    round: int
    rid: int
    step: int
    messages: list
    tools: tuple
    max_tokens: int
    drop_after: int
    outcome: str = ""  # done | dropped | the error's code
    errors: list = field(default_factory=list)  # the codes of the attempts that failed
    ids: list = field(default_factory=list)
    text: str = ""
    attempts: int = 0
    restore_ms: float = 0.0
    ttft_ms: float = 0.0
    cached: int = 0


def run(args) -> int:
    from engine.config import EngineConfig

    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        print(f"lineage bench faults: unknown faults {unknown}; known: {', '.join(FAULTS)}")
        return 1
    flags = {"model": args.model, "ram_budget": args.ram_budget, "kernels": kernel_set()}
    base = EngineConfig.from_sources(flags, {}).with_server(
        port=0,
        replicas=2,
        route_threshold=args.route_threshold,
        loop_deadline=args.loop_deadline,
        call_deadline=20.0,
        stream_deadline=300.0,
    )
    with cache_dir(args.cache_dir, "faults") as root, own_ray(logs=False):
        faulted = _faulted_run(_config(base, root / "faulted", "faults"), faults, args)
        # Shown before the replay, which a loaded machine may fail to start.
        print("\n".join(_fault_lines(faulted["faults"])), flush=True)
        baseline = _replay(_config(base, root / "baseline", "baseline"), faulted["sent"])
    figures = _figures(faulted, baseline, args)
    emit(figures, args, report)
    ok = (
        figures["faults_survived"] == len(faults)
        and figures["wrong_replies"] == 0
        and figures["leaked_bytes"] == 0
        and figures["orphaned_files"] == 0
        and figures["invariant_violations"] == 0
        and figures["final"]["clean"]
    )
    return 0 if ok else 1


def _config(base, cache_dir: Path, name: str):
    return base.with_cache(cache_dir=str(cache_dir)).with_server(
        ray_namespace=f"lineage-{name}-{os.getpid()}"
    )


# ---- the faulted run -----------------------------------------------------------------


def _faulted_run(config, faults: list[str], args) -> dict:
    from clients.bench.faults.checks import Lasting
    from clients.bench.faults.injection import Injector
    from clients.client import Client
    from engine.server.running.background import BackgroundEngine

    with BackgroundEngine(config, timeout=600) as engine, Client(engine.address, timeout=300) as c:
        lasting = Lasting(args.lasting)
        checker = _Checker(engine, config, lasting)
        injector = Injector(engine, c, faults, args)
        checker.start()
        injector.start()
        t0 = time.monotonic()
        sent = _traffic(c, args, until=injector.done)
        seconds = time.monotonic() - t0
        injector.join()
        checker.stop()
        final = _final_check(engine, config, c)
        stats = c.cache_stats()
        handovers = sum(r.get("handovers", 0) for r in stats.get("replicas", []))
        sup = engine.engine.supervisor
        return {
            "sent": sent,
            "seconds": seconds,
            "faults": injector.results,
            "lasting": {
                **lasting.figures(),
                "skipped": checker.skipped,
                "longest_check_s": checker.seconds,
            },
            "final": final,
            "cache": {**{k: stats.get(k, 0) for k in _CACHE_FIGURES}, "handovers": handovers},
            "tiers": _replica_figures(engine),
            "restarts": sup.restarts,
            "wedged_restarts": sup.wedged_restarts,
            "retried_by_server": engine.engine.frontend.retries,
        }


_CACHE_FIGURES = ("restores_lost", "disk_writes_lost", "damaged_files", "disk_entries")


def _traffic(client, args, until: threading.Event) -> list[Sent]:
    """Rounds of agent traffic until the faults are done, then one more round."""
    from clients.bench.agents.traffic import Sessions, build_traffic

    out: list[Sent] = []
    more = 1
    for k in range(args.max_rounds):
        traffic = build_traffic(seed=args.seed + k, scale=args.scale, agents=args.agents)
        sessions = Sessions(traffic)
        with ThreadPoolExecutor(max(1, traffic.agents)) as pool:
            for step in traffic.steps():
                batch = []
                for spec in step:
                    messages = sessions.messages(spec)
                    batch.append(
                        Sent(
                            k,
                            spec.rid,
                            spec.step,
                            messages,
                            traffic.tools,
                            args.max_tokens * (8 if spec.drop_after else 1),
                            spec.drop_after,
                        )
                    )
                for s, spec in zip(pool.map(lambda s: _send(client, s, 3), batch), step):
                    sessions.record(spec, s.messages, s.text, s.outcome == "done")
                out += batch
        if until.is_set():
            more -= 1
            if more < 0:
                break
    return out


def _send(client, s: Sent, attempts: int) -> Sent:
    """Send `s` (again after a failure, up to `attempts` times); fills in its answer."""
    from clients.client import LineageError

    for attempt in range(1, attempts + 1):
        s.attempts = attempt
        try:
            s.outcome, s.ids, s.text, final = _stream(client, s)
            if final is not None:
                s.restore_ms, s.ttft_ms = final.timing.restore_ms, final.timing.ttft_ms
                s.cached = final.usage.cached_tokens
            return s
        except LineageError as e:
            s.outcome, s.ids, s.text = e.code, [], ""
            s.errors.append(e.code)
            time.sleep(1.0)
    return s


def _stream(client, s: Sent):
    from clients.client import Chunk, Final

    ids, texts, chunks, final = [], [], 0, None
    stream = client.stream(
        messages=s.messages,
        tools=list(s.tools),
        max_tokens=s.max_tokens,
        temperature=0.0,
    )
    for event in stream:
        if isinstance(event, Chunk):
            ids += event.ids
            texts.append(event.text)
            chunks += 1
            if s.drop_after and chunks >= s.drop_after:
                stream.cancel()
                return "dropped", ids, "".join(texts), None
        elif isinstance(event, Final):
            final = event
    return "done", ids, "".join(texts), final


class _Checker(threading.Thread):
    """Every second: the manager's audit, each replica's holdings, the directory's files."""

    def __init__(self, engine, config, lasting) -> None:
        super().__init__(name="fault-checker", daemon=True)
        self.engine, self.config, self.lasting = engine, config, lasting
        self.skipped: dict[str, int] = {}  # checks that could not read everything, by why
        self.seconds = 0.0  # the longest check
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)

    def run(self) -> None:
        due = time.monotonic()
        while not self._halt.wait(max(0.0, due - time.monotonic())):
            t0 = time.monotonic()
            due = t0 + 1.0  # every second (at once after a check that took longer)
            found = check_once(self.engine, self.config)
            self.seconds = max(self.seconds, time.monotonic() - t0)
            if isinstance(found, str):
                self.skipped[found] = self.skipped.get(found, 0) + 1
            else:
                self.lasting.see(found)


def check_once(engine, config, timeout: float = 5.0):
    """One check of a live engine: Findings, or why it could not read everything (the
    manager or a replica restarting)."""
    import ray

    from clients.bench.faults.checks import Holdings, compare, entry_files, read_holdings
    from engine.storage.file_format import entries_dir

    try:
        audit = ray.get(engine.engine.manager.audit.remote(), timeout=timeout)
    except Exception as e:
        return f"manager: {type(e).__name__}"
    held = []
    for r, model in enumerate(engine.engine.replicas):
        try:
            h = ray.get(model.__ray_call__.remote(read_holdings), timeout=timeout)
        except Exception as e:  # dead or restarting: its queue is unknown
            return f"replica {r}: {type(e).__name__}"
        if h is None:
            return f"replica {r}: loading"
        held.append(Holdings(r, **h))
    return compare(audit, held, entry_files(entries_dir(config.cache.cache_dir)))


def _final_check(engine, config, client, tries: int = 30) -> dict:
    """After the traffic: the engine up, the writers flushed, then a strict check (retried
    while messages may still be in flight)."""
    import ray

    from clients.bench.disk_leak import disk_leaked_bytes

    client.wait_ready(120)
    found = None
    for _ in range(tries):
        for model in engine.engine.replicas:
            ray.get(model.flush_disk.remote(60), timeout=90)
        time.sleep(1.0)
        found = check_once(engine, config)
        if not isinstance(found, str) and not found:
            break
    if isinstance(found, str):
        return {"clean": False, "why": f"the check could not read: {found}"}
    disk_leaked = disk_leaked_bytes(client, config.cache.cache_dir, config.cache.mode, 30.0)
    return {
        "clean": not found and not disk_leaked,
        "leaked_bytes": sum(found.leaked.values()),
        "disk_leaked_bytes": disk_leaked,
        "leaked": sorted(found.leaked),
        "orphaned_files": sorted(found.orphans),
        "unwritten_files": sorted(found.unwritten),
        "miscounted": sorted(found.miscounted),
        "drift": dict(found.drift),
        "violation": found.violation,
    }


def _replica_figures(engine) -> list[dict]:
    import ray

    out = []
    for model in engine.engine.replicas:
        t = ray.get(model.generator_stats.remote(), timeout=60)
        out.append(
            {
                "file_loads": (t.disk or {}).get("loads", 0),
                "token_checks": t.token_checks,
                "token_check_seconds": t.token_check_seconds,
                "token_mismatches": t.token_mismatches,
                "ram_bytes": t.ram_bytes,
                "no_space": (t.disk or {}).get("writer", {}).get("no_space", 0),
            }
        )
    return out


# ---- the fault-free replay -------------------------------------------------------------


def _replay(config, sent: list[Sent]) -> dict:
    """Every prompt of the faulted run on a fault-free engine, step by step; its replies."""
    from clients.client import Client
    from engine.server.running.background import BackgroundEngine

    steps: dict[tuple[int, int], list[Sent]] = {}
    for s in sent:
        steps.setdefault((s.round, s.step), []).append(s)
    replies: dict[tuple[int, int], Sent] = {}
    with BackgroundEngine(config, timeout=600) as engine, Client(engine.address, timeout=300) as c:
        with ThreadPoolExecutor(max(len(b) for b in steps.values())) as pool:
            for key in sorted(steps):
                batch = [_fresh(s) for s in steps[key]]
                for s in pool.map(lambda s: _send(c, s, 1), batch):
                    replies[(s.round, s.rid)] = s
        tiers = _replica_figures(engine)
    return {"replies": replies, "tiers": tiers}


def _fresh(s: Sent) -> Sent:
    return Sent(s.round, s.rid, s.step, s.messages, s.tools, s.max_tokens, s.drop_after)


# ---- figures ---------------------------------------------------------------------------


def _figures(faulted: dict, baseline: dict, args) -> dict:
    sent, replies = faulted["sent"], baseline["replies"]
    compared = wrong = 0
    examples = []
    for s in sent:
        ref = replies.get((s.round, s.rid))
        if s.outcome != "done" or ref is None or ref.outcome != "done":
            continue
        compared += 1
        if s.ids != ref.ids:
            wrong += 1
            examples.append({"round": s.round, "rid": s.rid, "got": s.ids, "want": ref.ids})
    outcomes: dict[str, int] = {}
    errors: dict[str, int] = {}
    for s in sent:
        outcomes[s.outcome] = outcomes.get(s.outcome, 0) + 1
        for code in s.errors:
            errors[code] = errors.get(code, 0) + 1
    checks = sum(t["token_checks"] for t in baseline["tiers"])
    check_s = sum(t["token_check_seconds"] for t in baseline["tiers"])
    restored = [r for r in replies.values() if r.outcome == "done" and r.cached]
    lasting = faulted["lasting"]
    return {
        "faults": faulted["faults"],
        "faults_survived": sum(f["survived"] for f in faulted["faults"]),
        "requests": len(sent),
        "rounds": 1 + max((s.round for s in sent), default=0),
        "traffic_s": faulted["seconds"],
        "outcomes": dict(sorted(outcomes.items())),
        "client_errors": dict(sorted(errors.items())),
        "retried_by_client": sum(s.attempts > 1 for s in sent),
        "retried_by_server": faulted["retried_by_server"],
        "compared_replies": compared,
        "wrong_replies": wrong,
        "wrong_examples": examples[:3],
        "leaked_bytes": max(lasting["leaked_bytes"], faulted["final"].get("leaked_bytes", 0))
        + faulted["final"].get("disk_leaked_bytes", 0),
        "disk_leaked_bytes": faulted["final"].get("disk_leaked_bytes", 0),
        "orphaned_files": max(
            lasting["orphaned_files"], len(faulted["final"].get("orphaned_files", []))
        ),
        "invariant_violations": lasting["invariant_violations"],
        "checks": lasting,
        "final": faulted["final"],
        "cache": faulted["cache"],
        "supervisor": {
            "restarts": faulted["restarts"],
            "wedged_restarts": faulted["wedged_restarts"],
        },
        "token_mismatches": sum(t["token_mismatches"] for t in faulted["tiers"]),
        "token_check_us": 1e6 * check_s / checks if checks else 0.0,
        "token_checks": checks,
        "restore_ms_mean": _mean([r.restore_ms for r in restored]),
        "warm_ttft_ms_mean": _mean([r.ttft_ms for r in restored]),
        "file_loads": sum(t["file_loads"] for t in faulted["tiers"]),
        "settings": {k: getattr(args, k) for k in ("scale", "agents", "ram_budget", "lasting")},
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _fault_lines(faults: list[dict]) -> list[str]:
    out = []
    for fault in faults:
        mark = "survived" if fault["survived"] else f"NOT survived ({fault['why']})"
        out.append(f"  {fault['fault']:<8} {mark} in {fault['recovery_s']:.1f} s: {fault['mark']}")
    return out


def report(f: dict) -> str:
    lines = ["lineage bench faults: 2 replicas under agent traffic", ""]
    lines += _fault_lines(f["faults"])
    c = f["checks"]
    check_ms = f["token_check_us"] / 1000
    of_restore = check_ms / f["restore_ms_mean"] if f["restore_ms_mean"] else 0.0
    of_ttft = check_ms / f["warm_ttft_ms_mean"] if f["warm_ttft_ms_mean"] else 0.0
    lines += [
        "",
        f"checks               {c['checks']} read whole in {f['traffic_s']:.0f} s of traffic, "
        f"skipped {c['skipped']} (the longest {c['longest_check_s']:.2f} s)",
        f"faults survived      {f['faults_survived']} of {len(f['faults'])}",
        f"requests             {f['requests']} in {f['rounds']} rounds: {f['outcomes']}",
        f"retried              {f['retried_by_client']} by the client (errors seen: "
        f"{f['client_errors']}), {f['retried_by_server']} by the server",
        f"replies compared     {f['compared_replies']} with the fault-free run's",
        f"wrong replies        {f['wrong_replies']}",
        f"leaked bytes         {f['leaked_bytes']}: RAM (lasting {c['lasting_after_checks']} "
        f"checks of {c['checks']}), and the disk budget against the files "
        f"{f['disk_leaked_bytes']}; final check {'clean' if f['final']['clean'] else 'NOT clean'}",
        f"orphaned files       {f['orphaned_files']}",
        f"invariant violations {f['invariant_violations']} {c['first_violation']}".rstrip(),
        f"unwritten, miscounted, drifting (lasting): {c['unwritten_files']}, "
        f"{c['miscounted_entries']}, {c['drifting_tiers']}",
        f"handovers {f['cache']['handovers']}, file loads {f['file_loads']}, restores lost "
        f"{f['cache']['restores_lost']}, disk writes lost {f['cache']['disk_writes_lost']}, "
        f"damaged files {f['cache']['damaged_files']}, token mismatches "
        f"{f['token_mismatches']}",
        f"token check          {f['token_check_us']:.1f} us per restore over "
        f"{f['token_checks']} checks (fault-free run): {100 * of_restore:.1f}% of the "
        f"restore itself ({f['restore_ms_mean']:.2f} ms), {100 * of_ttft:.2f}% of a warm "
        f"request's time to first token ({f['warm_ttft_ms_mean']:.1f} ms)",
    ]
    return "\n".join(lines)
