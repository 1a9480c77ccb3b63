"""A soak's report: what grew, what drifted, what failed, against the bounds it is held to.

From the samples (clients.bench.soak.samples), the users' requests, the faults'
results, the probes and the final stop:

- per process role, its RSS slope after warm-up (a least-squares line through
  the samples of its longest-lived process, from `warmup` after that process
  was first seen), in bytes per hour and in % of its mean size per hour, with
  its fds and threads at the first and last of those samples;
- per process (each life of each role), the slope over the last `TAIL`
  seconds of its life (after its warm-up), of its RSS and of its own memory
  (RSS less the pages mapped from files: its binary's code, paged in as code
  paths first run); shown beside the verdict, not judged: a bounded fill (a
  cache filling to its cap, code paged in) levels off by the end of a life, a
  leak keeps its slope;
- the disk tier's peak (its files) against its budget, and the largest gap
  between the files' bytes and the bytes the engine counts;
- time to first token per window (p50, p99), with the requests, errors,
  cached share and load average of the window; the last stretch's p50 against
  the first's after warm-up;
- errors by kind, those outside every fault's window apart; requests whose
  error carries no message; wrong probe replies; orphaned files after the stop;
- the verdict: each bound, and whether it holds. A bound on a rate (RSS slope,
  TTFT drift) is judged only on a run long enough for it (`JUDGED_AFTER`
  seconds after warm-up); a shorter run reports it unjudged.

Plain Python and numpy; matplotlib inside `plot`.
"""

from __future__ import annotations

import numpy as np

from clients.bench.figures import labelled, percentile

SLOPE_BOUND = 5.0  # % of a process's size per hour
DRIFT_BOUND = 1.2  # the last stretch's TTFT p50 over the first's
JUDGED_AFTER = 20 * 60  # seconds after warm-up before a rate is judged
TAIL = 15 * 60  # the last stretch of each life whose slope is shown (not judged)
STRETCH = 10 * 60  # the first and last stretch compared (shorter in a short run)
GRACE = 15.0  # seconds after a fault during which its errors are its own
# of the run after warm-up: a process followed at least this long is judged (the restart
# half way leaves each process of the serve a little under half of it)
MIN_SPAN = 0.3
# the engine's own processes: a run long enough to judge rates must judge each of them (the
# faults kill the model actor and the cache manager in the first half only, so that the
# second half is one life of each)
ENGINE_ROLES = ("frontend", "model-0", "cache-manager")


def figures(samples, events, faults, probes, final, soak, args) -> dict:
    seconds = args.minutes * 60
    warmup = args.warmup * 60 if args.warmup is not None else min(300.0, seconds / 5)
    width = args.window * 60 if args.window else max(seconds / 12, 10.0)
    span = max((s["t"] for s in samples), default=0.0)
    judged = span - warmup >= JUDGED_AFTER
    processes = process_slopes(samples, warmup, span, faults)
    lives = life_slopes(samples, warmup, faults)
    disk = disk_figures(samples, soak.disk_budget)
    windows = ttft_windows(events, samples, width, span)
    drift = ttft_drift(events, warmup, span, samples)
    errors = error_figures(events, faults)
    restart = next((f for f in faults if f["fault"] == "restart"), None)
    orphaned = final["orphaned"] + len(final["temps_left"])
    growing = [r for r, p in processes.items() if p["judged"] and p["pct_per_hour"] > SLOPE_BOUND]
    unjudged = [r for r in ENGINE_ROLES if not processes.get(r, {}).get("judged")]
    fd_growth = {
        r: (p["fds_first"], p["fds_last"])
        for r, p in processes.items()
        if p["judged"] and p["fds_last"] > p["fds_first"] + 8
    }
    thread_growth = {
        r: (p["threads_first"], p["threads_last"])
        for r, p in processes.items()
        if p["judged"] and p["threads_last"] > p["threads_first"] + 4
    }
    grammars = _first_last_max([_grammars(s) for s in samples])
    cache = getattr(args, "grammar_cache", None)
    checks = {
        "faults_survived": all(f["survived"] for f in faults),
        # the compiled grammars a replica keeps stay within --grammar-cache
        "grammars_within_cache": cache is None or (grammars["max"] or 0) <= cache,
        "disk_within_budget": disk["peak_bytes"] <= soak.disk_budget,
        "no_orphaned_files": orphaned == 0,
        # the budget's count of the disk tier against its files' bytes, writes settled
        "disk_count_is_files": final["bytes_gap"] == 0,
        "no_wrong_replies": not probes.wrong,
        "errors_clean": errors["unclean"] == 0 and errors["outside_faults"] == 0,
        "warm_after_restart": restart is None or restart["survived"],
        "fds_flat": not fd_growth,
        "threads_flat": not thread_growth,
    }
    if judged:
        checks["rss_slopes"] = not growing
        checks["engine_processes_judged"] = not unjudged
        checks["ttft_drift"] = drift["engine_ratio"] <= DRIFT_BOUND
    return {
        "minutes": args.minutes,
        "span_s": span,
        "warmup_s": warmup,
        "settings": {
            k: getattr(args, k)
            for k in (
                "ram_budget",
                "disk_budget",
                "scale",
                "agents",
                "tool_sets",
                "grammar_cache",
                "long_sessions",
                "seed",
            )
        },
        "requests": len(events),
        "samples": {"taken": len(samples), "failed": soak.sample_errors[:5]},
        "serve": {"starts": soak.serve.starts, "failed_starts": soak.serve.failed_starts},
        "faults": faults,
        "processes": processes,
        "lives": lives,
        "disk": disk,
        "object_store": _first_last_max([s["object_store_bytes"] for s in samples]),
        "grammars_held": grammars,
        "logs": log_figures(samples),
        "windows": windows,
        "ttft_drift": drift,
        "errors": errors,
        "probes": {"checked": probes.checked, "wrong": probes.wrong, "failed": probes.failed},
        "final": final,
        "verdict": {
            "ok": all(checks.values()),
            "checks": checks,
            "rates_judged": judged,
            "growing": growing,
            "unjudged": unjudged,
            "fd_growth": fd_growth,
            "thread_growth": thread_growth,
        },
        "series": series(samples),
    }


# ---- the figures ---------------------------------------------------------------------


def process_slopes(samples: list[dict], warmup: float, span: float, faults=()) -> dict:
    """Per role: the RSS slope of its longest-lived process after warm-up (counted from
    when it was first seen, or from the end of the fault it was started in)."""
    runs: dict[tuple[str, int], list] = {}
    for s in samples:
        for role, p in s["processes"].items():
            runs.setdefault((role, p["pid"]), []).append((s["t"], p))
    best: dict[str, dict] = {}
    for (role, pid), points in runs.items():
        born = points[0][0]
        for f in faults:
            if f["begin"] <= born <= f["end"]:
                born = f["end"]
        after = [(t, p) for t, p in points if t >= born + warmup]
        if len(after) < 3:
            continue
        t = np.array([a[0] for a in after]) / 3600
        rss = np.array([a[1]["rss"] for a in after], dtype=float)
        slope = float(np.polyfit(t, rss, 1)[0]) if t[-1] > t[0] else 0.0
        fig = {
            "pid": pid,
            "incarnations": sum(1 for r, _ in runs if r == role),
            "from_s": after[0][0],
            "to_s": after[-1][0],
            "rss_first": int(rss[0]),
            "rss_last": int(rss[-1]),
            "rss_max": int(rss.max()),
            "slope_bytes_per_hour": slope,
            "pct_per_hour": 100 * slope / float(rss.mean()) if rss.mean() else 0.0,
            "fds_first": after[0][1]["fds"],
            "fds_last": after[-1][1]["fds"],
            "threads_first": after[0][1]["threads"],
            "threads_last": after[-1][1]["threads"],
        }
        fig["judged"] = fig["to_s"] - fig["from_s"] >= MIN_SPAN * max(span - warmup, 1.0)
        if (
            role not in best
            or fig["to_s"] - fig["from_s"] > best[role]["to_s"] - best[role]["from_s"]
        ):
            best[role] = fig
    return dict(sorted(best.items()))


def _slope(t, y) -> float:
    """Least-squares slope of y over t (seconds), per hour."""
    t = np.asarray(t, dtype=float) / 3600
    return float(np.polyfit(t, np.asarray(y, dtype=float), 1)[0]) if t[-1] > t[0] else 0.0


def life_slopes(samples: list[dict], warmup: float, faults=(), tail: float = TAIL) -> dict:
    """Per role, each of its processes in the order they lived: the slope over the last
    `tail` seconds of its life (from its warm-up on, where the life is shorter), of its
    RSS and of its own memory (RSS less `rss_file`, where sampled); None where fewer than
    5 samples fall there."""
    runs: dict[tuple[str, int], list] = {}
    for s in samples:
        for role, p in s["processes"].items():
            runs.setdefault((role, p["pid"]), []).append((s["t"], p))
    out: dict[str, list] = {}
    for (role, pid), points in runs.items():
        born = points[0][0]
        for f in faults:
            if f["begin"] <= born <= f["end"]:
                born = f["end"]
        end = points[-1][0]
        window = [(t, p) for t, p in points if t >= max(born + warmup, end - tail)]
        life = {"pid": pid, "born_s": points[0][0], "end_s": end}
        if len(window) < 5:
            out.setdefault(role, []).append(life | {"tail": None})
            continue
        t = [w[0] for w in window]
        rss = [w[1]["rss"] for w in window]
        files = [w[1].get("rss_file") for w in window]
        own = None if None in files else [r - f for r, f in zip(rss, files)]
        slope = _slope(t, rss)
        own_slope = None if own is None else _slope(t, own)
        life["tail"] = {
            "from_s": t[0],
            "to_s": t[-1],
            "rss_first": int(rss[0]),
            "rss_last": int(rss[-1]),
            "slope_bytes_per_hour": slope,
            "pct_per_hour": 100 * slope / float(np.mean(rss)),
            "own_first": None if own is None else int(own[0]),
            "own_last": None if own is None else int(own[-1]),
            "own_slope_bytes_per_hour": own_slope,
            # of the whole RSS, so that the two add up
            "own_pct_per_hour": None if own is None else 100 * own_slope / float(np.mean(rss)),
        }
        out.setdefault(role, []).append(life)
    return {role: sorted(v, key=lambda x: x["born_s"]) for role, v in sorted(out.items())}


def disk_figures(samples: list[dict], budget: int) -> dict:
    files = [s["disk"]["bytes"] for s in samples]
    gaps = [
        abs(s["disk"]["bytes"] - s["disk"]["stats_bytes"])
        for s in samples
        if s["disk"].get("stats_bytes") is not None
    ]
    return {
        "budget_bytes": budget,
        "peak_bytes": max(files, default=0),
        "peak_files": max((s["disk"]["files"] for s in samples), default=0),
        "last_bytes": files[-1] if files else 0,
        "peak_stats_bytes": max((s["disk"]["stats_bytes"] or 0 for s in samples), default=0),
        # the files' bytes against the engine's count of them (in flight: writes queued)
        "largest_gap_bytes": max(gaps, default=0),
        "temps_seen": max((s["disk"]["temps"] for s in samples), default=0),
        "responses_first_bytes": samples[0]["disk"].get("responses_bytes", 0) if samples else 0,
        "responses_last_bytes": samples[-1]["disk"].get("responses_bytes", 0) if samples else 0,
    }


def ttft_windows(events: list, samples: list[dict], width: float, span: float) -> list[dict]:
    out = []
    k = 0
    while k * width < max(span, 1.0):
        lo, hi = k * width, (k + 1) * width
        inside = [e for e in events if lo <= e.t < hi]
        done = [e for e in inside if not e.error and not e.dropped]
        ttft = [e.ttft_ms for e in done]
        prompt = sum(e.prompt for e in done)
        loads = [s["load"][0] for s in samples if lo <= s["t"] < hi]
        reference = _reference(samples, lo, hi)
        out.append(
            {
                "from_s": lo,
                "requests": len(inside),
                "completed": len(done),
                "errors": sum(1 for e in inside if e.error),
                "ttft_p50_ms": percentile(ttft, 50),
                "ttft_p99_ms": percentile(ttft, 99),
                "cached_share": sum(e.cached for e in done) / prompt if prompt else 0.0,
                "load": float(np.mean(loads)) if loads else 0.0,
                "reference_ms": reference,
            }
        )
        k += 1
    return out


def ttft_drift(events: list, warmup: float, span: float, samples=()) -> dict:
    """The last stretch's TTFT p50 against the first stretch's after warm-up, beside the
    machine's own drift over the same stretches: the median of the reference work's times
    (clients.bench.soak.reference). `engine_ratio`, the one over the other, is the drift
    the bound holds: the engine's, with the machine's speed taken out (the ratio itself
    where the reference was not timed)."""
    stretch = min(STRETCH, max(span - warmup, 1.0) / 4)
    done = [e for e in events if not e.error and not e.dropped]
    first = [e.ttft_ms for e in done if warmup <= e.t < warmup + stretch]
    last = [e.ttft_ms for e in done if span - stretch <= e.t]
    p_first, p_last = percentile(first, 50), percentile(last, 50)
    ratio = p_last / p_first if p_first else 0.0
    r_first = _reference(samples, warmup, warmup + stretch)
    r_last = _reference(samples, span - stretch, span + 1.0)
    reference = r_last / r_first if r_first and r_last else None
    return {
        "stretch_s": stretch,
        "first_p50_ms": p_first,
        "last_p50_ms": p_last,
        "ratio": ratio,
        "reference_first_ms": r_first,
        "reference_last_ms": r_last,
        "reference_ratio": reference,
        "engine_ratio": ratio / reference if reference else ratio,
    }


def _reference(samples, lo: float, hi: float) -> float | None:
    """The median reference time of the samples from `lo` to before `hi` (None: none)."""
    times = [s["reference_ms"] for s in samples if lo <= s["t"] < hi and s.get("reference_ms")]
    return float(np.median(times)) if times else None


def error_figures(events: list, faults: list[dict]) -> dict:
    def in_fault(t: float) -> str:
        for f in faults:
            if f["begin"] <= t <= f["end"] + GRACE:
                return f["fault"]
        return ""

    by_kind: dict[str, int] = {}
    by_fault: dict[str, int] = {}
    outside: list[dict] = []
    unclean = 0
    for e in events:
        if not e.error:
            continue
        by_kind[e.error] = by_kind.get(e.error, 0) + 1
        fault = in_fault(e.t)
        if fault:
            by_fault[fault] = by_fault.get(fault, 0) + 1
        else:
            outside.append(
                {
                    "t": e.t,
                    "user": e.user,
                    "api": e.api,
                    "error": e.error,
                    "message": e.message[:200],
                }
            )
        if not e.message:  # no status or message the user could act on
            unclean += 1
    return {
        "by_kind": dict(sorted(by_kind.items())),
        "by_fault": dict(sorted(by_fault.items())),
        "outside_faults": len(outside),
        "outside_examples": outside[:5],
        "unclean": unclean,
        "dropped_streams": sum(e.dropped for e in events),
    }


def log_figures(samples: list[dict]) -> dict:
    """Per log, its size first and last and its growth per hour (a restart starts the Ray
    session's logs anew: growth is summed over the rises between samples)."""
    if not samples:
        return {}
    hours = max(samples[-1]["t"] - samples[0]["t"], 1.0) / 3600
    out = {}
    for k in samples[0]["logs"]:
        sizes = [s["logs"][k] for s in samples]
        grown = sum(max(0, b - a) for a, b in zip(sizes, sizes[1:]))
        out[k] = {"first": sizes[0], "last": sizes[-1], "bytes_per_hour": grown / hours}
    return out


def _grammars(sample: dict) -> int | None:
    """The compiled grammars the replicas held at a sample (None: not read)."""
    replicas = sample.get("replicas")
    return sum(r.get("grammars_held", 0) for r in replicas) if replicas else None


def _first_last_max(values: list) -> dict:
    known = [v for v in values if v is not None]
    if not known:
        return {"first": None, "last": None, "max": None}
    return {"first": known[0], "last": known[-1], "max": max(known)}


def series(samples: list[dict]) -> dict:
    """What the plot draws, per sample."""
    roles = sorted({r for s in samples for r in s["processes"] if not r.startswith("ray-worker")})
    return {
        "t": [s["t"] for s in samples],
        "rss": {r: [s["processes"].get(r, {}).get("rss") for s in samples] for r in roles},
        "disk_bytes": [s["disk"]["bytes"] for s in samples],
        "stats_bytes": [s["disk"].get("stats_bytes") for s in samples],
        "object_store_bytes": [s["object_store_bytes"] for s in samples],
        "ttft_p50_ms": [s["window"]["ttft_p50_ms"] for s in samples],
        "ttft_p99_ms": [s["window"]["ttft_p99_ms"] for s in samples],
        "load": [s["load"][0] for s in samples],
        "reference_ms": [s.get("reference_ms") for s in samples],
        "fault": [s["fault"] for s in samples],
    }


# ---- the text ------------------------------------------------------------------------


def _mb(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def format_report(f: dict) -> str:
    v = f["verdict"]
    lines = [
        f"lineage bench soak: {f['minutes']:g} minutes, {f['requests']} requests "
        f"(warm-up {f['warmup_s'] / 60:.1f} min; rates judged: {v['rates_judged']})",
        "",
        "faults:",
    ]
    for x in f["faults"]:
        mark = x.get("mark") if x["survived"] else f"NOT survived: {x.get('why')}"
        lines.append(f"  {x['begin'] / 60:6.1f} min {x['fault']:<10} {mark}")
    lines += ["", "process            RSS last   slope/h       %/h   fds     threads   lives"]
    for role, p in f["processes"].items():
        judged = "" if p["judged"] else "  (short)"
        lines.append(
            f"  {role:<16} {_mb(p['rss_last']):>10} {p['slope_bytes_per_hour'] / 2**20:+8.2f}M "
            f"{p['pct_per_hour']:+7.2f}%  {p['fds_first']:>3}->{p['fds_last']:<4} "
            f"{p['threads_first']:>3}->{p['threads_last']:<4} {p['incarnations']}{judged}"
        )
    lines += [
        "",
        f"per life, its last {TAIL // 60} minutes (not judged; own: RSS less file pages):",
    ]
    for role, lives in f.get("lives", {}).items():
        for life in lives:
            x = life["tail"]
            if x is None or x["to_s"] - x["from_s"] < TAIL / 3:
                continue
            own = (
                ""
                if x["own_slope_bytes_per_hour"] is None
                else f", own {_mb(x['own_first'])} -> {_mb(x['own_last'])} "
                f"{x['own_slope_bytes_per_hour'] / 2**20:+.2f}M/h {x['own_pct_per_hour']:+.1f}%/h"
            )
            lines.append(
                f"  {role:<16} {x['from_s'] / 60:5.1f}-{x['to_s'] / 60:5.1f} min: RSS "
                f"{_mb(x['rss_first'])} -> {_mb(x['rss_last'])} "
                f"{x['slope_bytes_per_hour'] / 2**20:+.2f}M/h {x['pct_per_hour']:+.1f}%/h{own}"
            )
    d, fin, e, dr = f["disk"], f["final"], f["errors"], f["ttft_drift"]
    lines += ["", "window   requests  errors  TTFT p50   p99      cached  load  reference ms"]
    for w in f["windows"]:
        lines.append(
            f"  {w['from_s'] / 60:5.1f}m {w['requests']:>8} {w['errors']:>7} "
            f"{w['ttft_p50_ms']:8.1f} {w['ttft_p99_ms']:8.1f} {w['cached_share']:8.1%} "
            f"{w['load']:5.2f}  {_ms(w.get('reference_ms'))}"
        )
    lines += [""] + labelled(
        [
            (
                "disk tier",
                f"peak {_mb(d['peak_bytes'])} of a {_mb(d['budget_bytes'])} budget "
                f"({d['peak_files']} files); engine's count peak {_mb(d['peak_stats_bytes'])}, "
                f"largest gap files vs count {_mb(d['largest_gap_bytes'])}",
            ),
            (
                "object store",
                f"{_mb(f['object_store']['first'])} -> "
                f"{_mb(f['object_store']['last'])} (max {_mb(f['object_store']['max'])})",
            ),
            (
                "grammars held",
                "{first} -> {last} (max {max} of the {cache} --grammar-cache keeps: the "
                "replicas' compiled tool and schema grammars)".format(
                    cache=f["settings"].get("grammar_cache"),
                    **f.get("grammars_held", _first_last_max([])),
                ),
            ),
            (
                "logs",
                ", ".join(
                    f"{k} {_mb(x['last'])} ({x['bytes_per_hour'] / 2**20:.2f} MiB/h)"
                    for k, x in f["logs"].items()
                ),
            ),
            (
                "TTFT drift",
                f"p50 {dr['first_p50_ms']:.1f} ms first {dr['stretch_s'] / 60:.1f} "
                f"min after warm-up, {dr['last_p50_ms']:.1f} ms last: x{dr['ratio']:.2f}; "
                f"the machine's reference {_ms(dr.get('reference_first_ms'))} -> "
                f"{_ms(dr.get('reference_last_ms'))} ms: the engine's own "
                f"x{dr.get('engine_ratio', dr['ratio']):.2f}",
            ),
            (
                "errors",
                f"{e['by_kind']} (during faults {e['by_fault']}; outside "
                f"{e['outside_faults']}; without a clean status and message {e['unclean']})",
            ),
            ("dropped streams", str(e["dropped_streams"])),
            (
                "wrong replies",
                f"{len(f['probes']['wrong'])} of {f['probes']['checked']} probe "
                f"replies checked ({len(f['probes']['failed'])} probes failed)",
            ),
            (
                "final stop",
                f"{fin['stop']['seconds']:.1f} s, exit {fin['stop']['returncode']}; "
                f"{fin['files']} files, {fin['counted']} counted by the engine, orphaned "
                f"{fin['orphaned']}, temporary left {len(fin['temps_left'])}; the files' bytes "
                f"less the engine's count {fin['bytes_gap']}",
            ),
            ("cache", str(fin["cache"])),
            (
                "serve starts",
                f"{f['serve']['starts']} ({len(f['serve']['failed_starts'])} failed "
                "and tried again)",
            ),
            (
                "verdict",
                ("OK" if v["ok"] else "FAILED")
                + ": "
                + ", ".join(f"{k} {'ok' if ok else 'FAILED'}" for k, ok in v["checks"].items()),
            ),
        ],
        17,
    )
    if f.get("heap"):
        from clients.bench.soak.heap import format_growth

        lines += ["", "front end heap (tracemalloc, by line):"]
        lines += format_growth(f["heap"]["lives"]) + [f"  {e}" for e in f["heap"]["errors"]]
    return "\n".join(lines)


def plot(f: dict, path: str) -> None:
    """Memory per process, disk and object store, TTFT and load, over time; faults marked."""
    from clients.bench.figures import pyplot, save_figure

    plt = pyplot()
    s = f["series"]
    t = np.array(s["t"]) / 60
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    for role, rss in s["rss"].items():
        ax1.plot(t, [np.nan if r is None else r / 2**20 for r in rss], label=role, lw=1)
    ax1.set_ylabel("RSS (MiB)")
    ax1.legend(fontsize=7, ncol=4)
    ax2.plot(t, np.array(s["disk_bytes"]) / 2**20, label="disk tier files")
    ax2.plot(
        t,
        [np.nan if b is None else b / 2**20 for b in s["stats_bytes"]],
        "--",
        label="disk tier (engine's count)",
    )
    ax2.plot(
        t,
        [np.nan if b is None else b / 2**20 for b in s["object_store_bytes"]],
        label="Ray object store",
    )
    ax2.axhline(f["disk"]["budget_bytes"] / 2**20, color="red", lw=0.8, label="disk budget")
    ax2.set_ylabel("MiB")
    ax2.legend(fontsize=7)
    ax3.plot(t, s["ttft_p50_ms"], ".", ms=3, label="TTFT p50 (sample window)")
    ax3.plot(t, s["ttft_p99_ms"], ".", ms=2, alpha=0.5, label="TTFT p99")
    reference = [np.nan if r is None else r for r in s.get("reference_ms", [])]
    if reference:
        ax3.plot(t, reference, ".", ms=2, color="green", label="the machine's reference work")
    ax3.set_yscale("log")
    ax3.set_ylabel("ms")
    ax3.set_xlabel("minutes")
    load = ax3.twinx()
    load.plot(t, s["load"], color="gray", lw=0.8, label="load average (1 min)")
    load.set_ylabel("load")
    ax3.legend(fontsize=7, loc="upper left")
    for x in f["faults"]:
        for ax in (ax1, ax2, ax3):
            ax.axvline(x["begin"] / 60, color="orange", lw=0.6, alpha=0.7)
        ax1.annotate(
            x["fault"],
            (x["begin"] / 60, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=6,
            rotation=90,
            va="top",
        )
    fig.suptitle(f"lineage bench soak, {f['minutes']:g} min")
    save_figure(fig, path)
