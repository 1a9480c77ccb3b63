"""The agent benchmark's figures: per-policy summaries, the table, the plot.

Reads PolicyRun records (clients.bench.agents.observed) and the oracle; knows nothing
about engines or traffic generation. matplotlib loads only when `plot` draws.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from clients.bench.agents.observed import POLICIES, PolicyRun, oracle_lengths
from clients.bench.agents.replicas import compare
from clients.bench.figures import Column, percentile, pyplot, save_figure, table


def summarize(run: PolicyRun, phases: dict | None = None) -> dict:
    """The policy's figures over its completed requests, against its own oracle; also per
    phase of the traffic (`phases`: request id -> phase name, for requests in one)."""
    obs = run.observed
    oracle = oracle_lengths([o.step for o in obs], [o.prompt for o in obs], [o.stored for o in obs])
    done = [(o, n) for o, n in zip(obs, oracle) if o.completed]
    prompt = sum(len(o.prompt) for o, _ in done)
    cached = sum(o.cached for o, _ in done)
    best = sum(n for _, n in done)
    ttft = [o.ttft_ms for o, _ in done]
    completion = sum(len(o.completion) for o, _ in done)
    last = run.stats[-1] if run.stats else {}
    written = last.get("disk_bytes_written", 0)
    return {
        "requests": len(done),
        "dropped": len(obs) - len(done),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "oracle_cached_tokens": best,
        "oracle_fraction": cached / best if best else 1.0,
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p90": percentile(ttft, 90),
        "prefill_tokens": prompt - cached,
        "ram_bytes": int(last.get("ram_bytes", 0)),
        "ram_bytes_peak": int(max((s["ram_bytes"] for s in run.stats), default=0)),
        "disk_bytes": int(last.get("disk_bytes", 0)),
        "evictions": int(run.evictions),
        "disk_bytes_per_turn": written / len(done) if done else 0.0,
        "restore_kinds": dict(sorted(Counter(o.restore for o, _ in done).items())),
        "wall_s": round(run.wall_s, 2),
        "completion_tokens": completion,
        "tokens_per_s": (prompt + completion) / run.wall_s if run.wall_s else 0.0,
        **({"replicas": run.replicas} if run.replicas else {}),
        "phases": _phases(done, phases or {}),
        "per_request": [
            {
                "rid": o.rid,
                "step": o.step,
                "lane": o.lane,
                "kind": o.kind,
                "prompt_tokens": len(o.prompt),
                "cached_tokens": o.cached,
                "oracle": n,
                "restore": o.restore,
                "restore_length": o.restore_length,
                "ttft_ms": round(o.ttft_ms, 2),
                "completed": o.completed,
            }
            for o, n in zip(obs, oracle)
        ],
    }


def _phases(done: list, phases: dict) -> dict:
    """Cached tokens against the oracle over each phase's completed requests, over its
    sessions' first requests alone (where nothing of the session is stored yet), and per
    request kind (the edits inside long messages are the message phase's own kinds)."""
    out = {}
    for name in sorted(set(phases.values())):
        rows = [(o, n) for o, n in done if phases.get(o.rid) == name]
        first = _share([(o, n) for o, n in rows if o.kind == "first"])
        out[name] = {
            **_share(rows),
            "first_cached_tokens": first["cached_tokens"],
            "first_oracle_cached_tokens": first["oracle_cached_tokens"],
            "first_oracle_fraction": first["oracle_fraction"],
            "kinds": _kinds(rows),
        }
    return out


def _share(rows: list) -> dict:
    """Requests, cached tokens, the oracle's, their fraction (1.0 when nothing was reusable)."""
    cached, best = sum(o.cached for o, _ in rows), sum(n for _, n in rows)
    return {
        "requests": len(rows),
        "cached_tokens": cached,
        "oracle_cached_tokens": best,
        "oracle_fraction": cached / best if best else 1.0,
    }


def _kinds(rows: list) -> dict:
    """Per request kind: `_share` of its requests."""
    kinds = sorted({o.kind for o, _ in rows})
    return {kind: _share([(o, n) for o, n in rows if o.kind == kind]) for kind in kinds}


# Request kinds a phase exists to show, printed on their own under its line.
PHASE_KINDS = ("edit_inside", "truncate")

POLICY_COLUMNS = (
    Column("policy", 13, align="<"),
    Column("cached", 8),
    Column("oracle%", 8, ".1%"),
    Column("ttft p50", 9, ".1f"),
    Column("ttft p90", 9, ".1f"),
    Column("prefill", 8),
    Column("ram MB", 8, ".1f"),
    Column("disk MB", 8, ".1f"),
    Column("evict", 6),
    Column("disk B/turn", 11, ".0f"),
    Column("restore kinds", align="<", gap=2),
)


def _policy_row(name: str, p: dict) -> tuple:
    kinds = " ".join(f"{k}={v}" for k, v in p["restore_kinds"].items())
    return (
        name,
        p["cached_tokens"],
        p["oracle_fraction"],
        p["ttft_ms_p50"],
        p["ttft_ms_p90"],
        p["prefill_tokens"],
        p["ram_bytes"] / 1e6,
        p["disk_bytes"] / 1e6,
        p["evictions"],
        p["disk_bytes_per_turn"],
        kinds,
    )


def format_table(report: dict) -> str:
    """The side-by-side table, then where lineage falls short of the oracle."""
    t = report["traffic"]
    lines = [
        (
            f"agents traffic: scale {t['scale']}, {t['agents']} agents, "
            f"{t['requests']} requests in "
            f"{t['steps']} steps, {t['sessions']} sessions, prefix ~{t['prefix_tokens_estimate']} "
            f"estimated tokens; oracle {report['oracle']['cached_tokens']} cached tokens"
        ),
        *table(POLICY_COLUMNS, [_policy_row(n, p) for n, p in report["policies"].items()]),
    ]
    for name, p in report["policies"].items():
        for phase, f in p.get("phases", {}).items():
            lines.append(
                f"{name:<13} phase {phase}: {f['cached_tokens']} of the oracle's "
                f"{f['oracle_cached_tokens']} cached tokens ({f['oracle_fraction']:.1%}) over "
                f"{f['requests']} requests; their first requests {f['first_cached_tokens']} of "
                f"{f['first_oracle_cached_tokens']} ({f['first_oracle_fraction']:.1%})"
            )
            own = {k: v for k, v in f.get("kinds", {}).items() if k in PHASE_KINDS}
            if own:
                lines.append(
                    f"{'':<13}   "
                    + "; ".join(
                        f"{k} {v['cached_tokens']} of {v['oracle_cached_tokens']} "
                        f"({v['oracle_fraction']:.1%}) over {v['requests']}"
                        for k, v in own.items()
                    )
                )
    lineage = report["policies"].get("lineage")
    if lineage:
        short = [
            r for r in lineage["per_request"] if r["completed"] and r["cached_tokens"] < r["oracle"]
        ]
        lines.append(
            f"lineage below the oracle on {len(short)} requests "
            f"({sum(r['oracle'] - r['cached_tokens'] for r in short)} tokens):"
        )
        for r in sorted(short, key=lambda r: r["cached_tokens"] - r["oracle"])[:12]:
            lines.append(
                f"  request {r['rid']:>3} step {r['step']:>2} lane {r['lane']} "
                f"{r['kind']:<11} prompt {r['prompt_tokens']:>6} cached "
                f"{r['cached_tokens']:>6} oracle {r['oracle']:>6} "
                f"restore {r['restore']}@{r['restore_length']}"
            )
    replicas = compare(report)
    return "\n".join(lines + ([replicas] if replicas else []))


COLORS = dict(zip(POLICIES, ["#1b7837", "#2166ac", "#b2182b", "#e08214", "#762a83"]))


def plot(report: dict, path: str) -> None:
    """Cached fraction per request over the traffic, and the time-to-first-token spread."""
    plt = pyplot()
    names = list(report["policies"])
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [2.3, 1]}
    )
    _plot_cached(left, report, names)
    _plot_ttft(right, report, names)
    t = report["traffic"]
    summary = ", ".join(f"{n} {report['policies'][n]['oracle_fraction']:.0%}" for n in names)
    fig.suptitle(
        f"lineage bench agents: scale {t['scale']}, {t['agents']} agents, "
        f"{t['requests']} requests; cached tokens / oracle: {summary}"
    )
    save_figure(fig, path, dpi=110)


def _plot_cached(ax, report: dict, names: list) -> None:
    """Each policy's cached fraction per request, over the oracle's (grey bars)."""
    oracle = {r["rid"]: r for r in report["policies"][names[0]]["per_request"]}
    x = sorted(r for r in oracle if oracle[r]["completed"])
    ax.bar(
        x,
        [oracle[r]["oracle"] / oracle[r]["prompt_tokens"] for r in x],
        width=0.9,
        color="0.87",
        label="oracle",
    )
    # Drawn back to front, lineage on top; small x offsets keep equal values visible.
    order = sorted(names, key=lambda n: n == "lineage")
    for i, name in enumerate(order):
        rows = [r for r in report["policies"][name]["per_request"] if r["completed"]]
        dx = (i - (len(order) - 1) / 2) * 0.12
        ax.plot(
            [r["rid"] + dx for r in rows],
            [r["cached_tokens"] / r["prompt_tokens"] for r in rows],
            "o-" if name == "lineage" else "o:",
            ms=4 if name == "lineage" else 3,
            lw=1.6 if name == "lineage" else 0.9,
            color=COLORS.get(name),
            label=name,
        )
    ax.set(
        xlabel="request (traffic order; concurrent requests share a step)",
        ylabel="cached / prompt tokens",
        ylim=(-0.03, 1.03),
        title="cached fraction per request (grey: the oracle)",
    )
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(
        handles,
        labels,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.07),
        ncol=5,
        fontsize=9,
        frameon=False,
    )
    ax.grid(alpha=0.3)


def _plot_ttft(ax, report: dict, names: list) -> None:
    """Each policy's time to first token: box, every request, p50 and p90."""
    data = [
        [max(r["ttft_ms"], 0.1) for r in report["policies"][n]["per_request"] if r["completed"]]
        for n in names
    ]
    box = ax.boxplot(data, orientation="horizontal", whis=(0, 100), patch_artist=True, widths=0.5)
    for patch, name in zip(box["boxes"], names):
        patch.set_facecolor(COLORS.get(name, "0.7"))
        patch.set_alpha(0.55)
    for i, (name, values) in enumerate(zip(names, data), start=1):
        ax.scatter(
            values, i + np.linspace(-0.12, 0.12, len(values)), s=7, color="k", alpha=0.45, zorder=3
        )
        p = report["policies"][name]
        ax.annotate(
            f"p50 {p['ttft_ms_p50']:.0f} ms, p90 {p['ttft_ms_p90']:.0f} ms",
            (0.99, i + 0.38),
            xycoords=("axes fraction", "data"),
            ha="right",
            fontsize=8,
        )
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.set(
        xscale="log",
        xlabel="time to first token (ms, log scale)",
        title="time to first token",
        ylim=(0.5, len(names) + 0.6),
    )
    ax.grid(alpha=0.3, axis="x")
