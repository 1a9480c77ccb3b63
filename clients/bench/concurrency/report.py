"""The concurrency benchmark's figures: per-run summaries, the table, the plot.

Reads the client-side records of clients.bench.concurrency (`Sent`); knows
nothing about engines or schedules. matplotlib loads only when `plot` draws.
"""

from __future__ import annotations

import numpy as np

from clients.bench.concurrency.time_split import split_lines
from clients.bench.figures import markdown_table, percentile, pyplot, save_figure

SHORT_TURN = 256  # uncached tokens of a "short warm turn"
COLD_MIN = 800  # prompt tokens of a cold prompt whose prefill rate is reported
LENGTHS = (1024, 2048, 4096, 8192)  # worst TTFT per prompt length: bucket upper bounds
HEADLINE = (  # the figures compared across rounds
    "ttft_ms_p50", "ttft_ms_p90", "cold_prefill_tok_per_s_p50", "longest_cold_ttft_ms",
)  # fmt: skip


def _bucket(tokens: int) -> str:
    for bound in LENGTHS:
        if tokens < bound:
            return f"<{bound}"
    return f">={LENGTHS[-1]}"


def cold_prefill(sent: list) -> dict:
    """Cold prompts over COLD_MIN tokens: prompt tokens per second of TTFT (median, min),
    the longest one's TTFT, and the worst TTFT of every request by prompt length."""
    colds = [s for s in sent if s.kind == "cold" and s.prompt_tokens > COLD_MIN]
    rates = [s.prompt_tokens / (s.ttft_ms / 1000) for s in colds if s.ttft_ms > 0]
    longest = max(colds, key=lambda s: (s.prompt_tokens, s.ttft_ms), default=None)
    worst: dict = {}
    for s in sent:
        if s.prompt_tokens:
            key = _bucket(s.prompt_tokens)
            worst[key] = max(worst.get(key, 0.0), s.ttft_ms)
    order = [f"<{b}" for b in LENGTHS] + [f">={LENGTHS[-1]}"]
    return {
        "cold_prompts": len(colds),
        "cold_prefill_tok_per_s_p50": percentile(rates, 50),
        "cold_prefill_tok_per_s_min": min(rates, default=0.0),
        "longest_cold_tokens": longest.prompt_tokens if longest else 0,
        "longest_cold_ttft_ms": longest.ttft_ms if longest else 0.0,
        "worst_ttft_ms_by_length": {k: worst[k] for k in order if k in worst},
    }


def _waiting(s) -> tuple[float, float]:
    """The interval a request waited for its first token."""
    return s.t_send, s.t_first or s.t_end


def _union(intervals) -> float:
    total, end = 0.0, -np.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _short_turns(sent: list, solo_ttft: dict, during_cold: bool) -> list:
    """TTFT/solo of short warm turns sent while a cold prompt prefilled (or not)."""
    colds = [s for s in sent if s.kind == "cold"]
    return [
        s.ttft_ms / solo_ttft[s.key]
        for s in sent
        if s.kind == "warm"
        and s.completed  # a dropped call has no usage to tell its size
        and s.prompt_tokens - s.cached_tokens <= SHORT_TURN
        and solo_ttft.get(s.key)
        and any(c.t_send <= s.t_send < _waiting(c)[1] for c in colds) == during_cold
    ]


def _itl_beside_prefill(sent: list) -> list:
    """Inter-token gaps (ms) during which another request waited for its first token."""
    itl = []
    for s in sent:
        others = [_waiting(q) for q in sent if q is not s]
        for a, b in zip(s.chunk_times, s.chunk_times[1:]):
            if any(qa < b and qb > a for qa, qb in others):
                itl.append((b - a) * 1000)
    return itl


def summarize(sent: list, solo: list, probe: dict | None) -> dict:
    """TTFT percentiles, TTFT over solo, ITL beside prefills, prefill rate, the probe."""
    solo_ttft = {s.key: s.ttft_ms for s in solo}
    ttft = [s.ttft_ms for s in sent]
    ratios = [s.ttft_ms / solo_ttft[s.key] for s in sent if solo_ttft.get(s.key)]
    colds = [s for s in sent if s.kind == "cold"]
    short = _short_turns(sent, solo_ttft, during_cold=True)
    short_alone = _short_turns(sent, solo_ttft, during_cold=False)
    itl = _itl_beside_prefill(sent)
    uncached = sum(max(0, s.prompt_tokens - s.cached_tokens) for s in sent)
    busy = _union([_waiting(s) for s in sent])
    t0 = min(s.t_send for s in sent)
    return {
        "requests": len(sent),
        "dropped": sum(1 for s in sent if not s.completed),
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p90": percentile(ttft, 90),
        "ttft_ms_p99": percentile(ttft, 99),
        "ttft_ms_p99_warm": percentile([s.ttft_ms for s in sent if s.kind == "warm"], 99),
        "ttft_ms_p50_cold": percentile([s.ttft_ms for s in colds], 50),
        "ttft_ms_p99_cold": percentile([s.ttft_ms for s in colds], 99),
        "ttft_over_solo_p50": percentile(ratios, 50),
        "ttft_over_solo_p90": percentile(ratios, 90),
        "short_turns_during_cold": len(short),
        "short_turn_over_solo_p50": percentile(short, 50),
        "short_turn_over_solo_max": max(short, default=0.0),
        # the same without a cold prompt in flight: what the lanes' own turns cost each other
        "short_turns_no_cold": len(short_alone),
        "short_turn_no_cold_over_solo_p50": percentile(short_alone, 50),
        "itl_ms_p50_beside_prefill": percentile(itl, 50),
        "itl_ms_p99_beside_prefill": percentile(itl, 99),
        "prompt_tokens": sum(s.prompt_tokens for s in sent),
        "cached_tokens": sum(s.cached_tokens for s in sent),
        "prefill_tokens": uncached,
        "prefill_tok_per_s": uncached / busy if busy else 0.0,
        **cold_prefill(sent),
        "probe": probe,
        "per_request": [
            {
                "key": s.key,
                "kind": s.kind,
                "t_send": round(s.t_send - t0, 4),
                "ttft_ms": round(s.ttft_ms, 2),
                "solo_ttft_ms": round(solo_ttft.get(s.key, 0.0), 2),
                "prompt_tokens": s.prompt_tokens,
                "cached_tokens": s.cached_tokens,
                "chunk_times": [round(t - t0, 4) for t in s.chunk_times],
            }
            for s in sent
        ],
    }


def ratios(report: dict, base: str = "batched") -> dict:
    """Each run's headline figures over `base`'s, from one run of the benchmark."""
    runs = {n: r for n, r in report["runs"].items() if "skipped" not in r}
    if base not in runs:
        return {}
    b = runs[base]
    out = {}
    for name, r in runs.items():
        out[name] = {
            k: (r[k] / b[k] if b[k] else 0.0)
            for k in ("ttft_ms_p50", "ttft_ms_p90", "prefill_tok_per_s")
        }
    return out


RUN_HEADER = (
    "run", "TTFT p50", "p90", "p99 ms", "TTFT/solo p50", "p90",
    "short turn during cold /solo (max)", "ITL p50", "p99 ms beside prefill", "prefill tok/s",
    "cached share",
)  # fmt: skip
PROBE_HEADER = (
    "probe (8k cold prefill)", "idle step ms", "ITL p50", "p99 ms", "p99 / idle step",
    "short turn ms", "solo ms", "/ solo", "8k TTFT beside decode / alone s",
)  # fmt: skip


def format_table(report: dict) -> str:
    """The runs side by side, then the probes, the floor and the grouping figures."""
    t = report["traffic"]
    skipped = {n: r["skipped"] for n, r in report["runs"].items() if "skipped" in r}
    report = {**report, "runs": {n: r for n, r in report["runs"].items() if n not in skipped}}
    count = next(iter(report["runs"].values()))["requests"] if report["runs"] else 0
    if "agents" in t:
        head = (
            f"{t['agents']} agents, {count} requests (cold prompts included), "
            f"prefix ~{t['prefix_tokens_estimate']} tokens"
        )
    else:  # the trace (clients.bench.concurrency.trace)
        head = (
            f"{t['traffic']}: {count} requests ({t['cold']} first turns), x{t['scale']} tokens, "
            f"one conversation in {t['one_conversation_in']}, over {t['span_s']:.0f} s"
        )
    lines = [
        head,
        "",
        *markdown_table(RUN_HEADER, [_run_row(n, r) for n, r in report["runs"].items()]),
    ]
    lines += [f"{n}: skipped: {why}" for n, why in skipped.items()]
    lines += _cold_lines(report["runs"])
    if report.get("load_average"):
        lines.append("load average (1, 5, 15 min) at the start and the end: " + " / ".join(
            ", ".join(f"{v:.2f}" for v in la) for la in report["load_average"]
        ))  # fmt: skip
    lines += ["", "short warm turns with no cold prompt in flight, TTFT/solo p50: " + "; ".join(
        f"{n} {r['short_turn_no_cold_over_solo_p50']:.2f} (n={r['short_turns_no_cold']})"
        for n, r in report["runs"].items()
    )]  # fmt: skip
    lines += ["", "TTFT ms, warm turns p99 / cold prompts p50, p99: " + "; ".join(
        f"{n} {r['ttft_ms_p99_warm']:.0f} / {r['ttft_ms_p50_cold']:.0f}, "
        f"{r['ttft_ms_p99_cold']:.0f}"
        for n, r in report["runs"].items()
    )]  # fmt: skip
    over = ratios(report)
    if over:
        lines += ["", "over batched: " + "; ".join(
            f"{n} p50 {v['ttft_ms_p50']:.2f}x p90 {v['ttft_ms_p90']:.2f}x "
            f"prefill {v['prefill_tok_per_s']:.2f}x"
            for n, v in over.items() if n != "batched"
        )]  # fmt: skip
    splits = {n: r["time_split"] for n, r in report["runs"].items() if r.get("time_split")}
    if splits:
        lines += split_lines(splits)
    probes = {n: r["probe"] for n, r in report["runs"].items() if r.get("probe")}
    if probes:
        lines += _probe_lines(probes)
    if report.get("floor_probe"):
        lines += _floor_lines(report["floor_probe"])
    g = report.get("grouping_probe")
    if g:
        lines += [
            "",
            f"prefill ms/token, chunks of {g['chunk']}: one sequence at a time "
            f"{g['ms_per_token_one_at_0']:.3f} (at 4k context "
            f"{g['ms_per_token_one_at_4096']:.3f}), {g['group']} grouped "
            f"{g['ms_per_token_grouped_at_0']:.3f} ({g['ms_per_token_grouped_at_4096']:.3f})",
        ]
    return "\n".join(lines)


def _cold_lines(runs: dict) -> list[str]:
    """Cold prefill rate and the worst TTFT by prompt length; across rounds, the spread."""
    lengths = sorted({k for r in runs.values() for k in r["worst_ttft_ms_by_length"]},
                     key=lambda k: (k.startswith(">"), int(k.strip("<>="))))  # fmt: skip
    header = ("run", f"cold >{COLD_MIN} tok/s of TTFT p50 (min, n)", "longest cold: tokens, TTFT s")
    rows = [
        [
            n,
            f"{r['cold_prefill_tok_per_s_p50']:.0f} ({r['cold_prefill_tok_per_s_min']:.0f}, "
            f"n={r['cold_prompts']})",
            f"{r['longest_cold_tokens']}, {r['longest_cold_ttft_ms'] / 1000:.2f}",
        ]
        for n, r in runs.items()
    ]
    worst = [
        [n] + [f"{r['worst_ttft_ms_by_length'].get(k, 0.0) / 1000:.2f}" for k in lengths]
        for n, r in runs.items()
    ]
    lines = ["", *markdown_table(header, rows), "", "worst TTFT s by prompt tokens:"]
    lines += markdown_table(["run", *lengths], worst)
    rounds = {n: r["rounds"] for n, r in runs.items() if len(r.get("rounds", ())) > 1}
    if rounds:
        lines += ["", "across rounds (median, min-max): " + ", ".join(HEADLINE)]
        for n, rs in rounds.items():
            parts = []
            for k in HEADLINE:
                v = [x[k] for x in rs]
                parts.append(f"{percentile(v, 50):.0f} ({min(v):.0f}-{max(v):.0f})")
            lines.append(f"- {n} ({len(rs)} rounds): " + "; ".join(parts))
    return lines


def _run_row(name: str, r: dict) -> list[str]:
    share = r["cached_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
    return [
        name,
        f"{r['ttft_ms_p50']:.0f}",
        f"{r['ttft_ms_p90']:.0f}",
        f"{r['ttft_ms_p99']:.0f}",
        f"{r['ttft_over_solo_p50']:.2f}",
        f"{r['ttft_over_solo_p90']:.2f}",
        f"{r['short_turn_over_solo_p50']:.2f} ({r['short_turn_over_solo_max']:.2f}, "
        f"n={r['short_turns_during_cold']})",
        f"{r['itl_ms_p50_beside_prefill']:.0f}",
        f"{r['itl_ms_p99_beside_prefill']:.0f}",
        f"{r['prefill_tok_per_s']:.0f}",
        f"{share:.2f}",
    ]


def _probe_lines(probes: dict) -> list[str]:
    """The probes' table, then the model loop's steps during the 8k prefill."""
    rows = [
        [
            name,
            f"{p['idle_step_ms']:.1f}",
            f"{p['itl_during_8k_prefill_ms_p50']:.1f}",
            f"{p['itl_during_8k_prefill_ms_p99']:.1f}",
            f"{p['itl_p99_over_idle_step']:.2f}",
            f"{p['short_turn_ttft_ms']:.0f}",
            f"{p['short_turn_solo_ttft_ms']:.0f}",
            f"{p['short_turn_over_solo']:.2f}",
            f"{p['cold_8k_ttft_ms'] / 1000:.1f} / {p.get('cold_8k_solo_ttft_ms', 0.0) / 1000:.1f}",
        ]
        for name, p in probes.items()
    ]
    lines = ["", *markdown_table(PROBE_HEADER, rows)]
    loops = {n: p["loop_steps_during_8k_prefill"] for n, p in probes.items()
             if p.get("loop_steps_during_8k_prefill", {}).get("steps")}  # fmt: skip
    if not loops:
        return lines
    lines += ["", "model loop steps during the 8k prefill (ms; slowest 1%: mean split)"]
    for name, p in probes.items():
        idle = p.get("loop_steps_idle") or {}
        if idle.get("steps"):
            lines.append(
                f"- {name} idle: {idle['steps']} steps, p50 {idle['total_ms_p50']:.2f}, "
                f"p99 {idle['total_ms_p99']:.2f}"
            )
    for name, q in loops.items():
        worst = ", ".join(f"{k} {v:.2f}" for k, v in q["slowest_1pct_ms"].items() if v)
        lines.append(
            f"- {name}: {q['steps']} steps, p50 {q['total_ms_p50']:.2f}, p99 "
            f"{q['total_ms_p99']:.2f}, {q['prefill_tokens_mean']:.1f} prompt tokens per "
            f"step; slowest 1% ({q['slowest_1pct_prefill_tokens']:.1f} tokens): {worst}"
        )
    return lines


def _floor_lines(f: dict) -> list[str]:
    """One forward of n prompt tokens per context, against a decode step."""
    sizes = list(next(iter(f["forward_ms"].values())))
    rows = [
        [str(context)] + [f"{v:.2f}" for v in row.values()]
        for context, row in f["forward_ms"].items()
    ]
    return [
        "",
        "floor: one forward of n prompt tokens at a context (ms, in process), against a "
        f"decode step {f['decode_ms']:.2f} ms",
        *markdown_table(["context"] + [f"n={n}" for n in sizes], rows),
    ]


def plot(report: dict, path: str) -> None:
    """TTFT distributions per run; inter-token gaps over time with prefills in flight."""
    plt = pyplot()
    runs = report["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    names = list(runs)
    left.boxplot([[r["ttft_ms"] for r in runs[n]["per_request"]] for n in names], whis=(5, 95))
    left.set_xticks(range(1, len(names) + 1), names, rotation=15)
    left.set_yscale("log")
    left.set_ylabel("time to first token (ms)")
    left.set_title("TTFT per request")
    twin = right.twinx()
    twin.set_ylabel("requests waiting for a first token (lines)")
    for name, color in (("batched", "tab:red"), ("srpt", "tab:blue")):
        if name not in runs:
            continue
        reqs = runs[name]["per_request"]
        xs, ys = [], []
        for r in reqs:
            times = r["chunk_times"]
            xs += times[1:]
            ys += [(b - a) * 1000 for a, b in zip(times, times[1:])]
        right.scatter(xs, ys, s=4, color=color, label=f"{name}: inter-token gap")
        grid = np.linspace(0, max(xs, default=1.0), 600)
        waiting = [
            sum(r["t_send"] <= g < r["t_send"] + r["ttft_ms"] / 1000 for r in reqs) for g in grid
        ]
        twin.plot(grid, waiting, color=color, alpha=0.4, lw=1)
    right.set_yscale("log")
    right.set_xlabel("seconds into the run")
    right.set_ylabel("inter-token gap (ms)")
    right.set_title("decode latency over time, with prefills in flight")
    right.legend(loc="upper right", fontsize=8)
    save_figure(fig, path, dpi=110)
