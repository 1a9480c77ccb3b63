"""`lineage bench speculative`: decode tokens/s with speculative decoding against `off`.

Three traffics (an edit that re-emits a 200-line file, tool-call JSON, free
chat; clients.bench.speculative.traffic) at 1, 4 and 8 streams, and on asking
(`--traffic tool_schema`) tool-call JSON held to a JSON schema, greedy, on
in-process engines that share one loaded model (the trained embedded model
without --model): per draft mode (`lookup`: prompt lookup, K fixed; `auto`:
the sources the model supports, K adapted, with `--draft-model` its draft
model beside lookup; `draft`: the draft model (`--draft-model`, the embedded
model's trained draft by default), K fixed; `lookup-whole`: lookup whose
rollbacks replay the whole model), decode tokens/s per stream and aggregate,
their ratio to `off` in the same run, the drafts' acceptance rate and mean
accepted length, and whether the tokens equal `off`'s.
"""

from __future__ import annotations

import argparse

from clients.bench.figures import Column, emit, plot_ready, table
from clients.cli.args import positive_ints

HELP = "speculative decoding: decode tokens/s per draft mode against off, three traffics"
# lookup-whole: lookup whose rollbacks replay the whole model (the other way, for comparison)
MODES = ("lookup", "auto", "mtp", "draft", "lookup-whole")
TRAFFICS = ("edit", "tool_json", "chat", "tool_schema")
DEFAULT_TRAFFICS = ["edit", "tool_json", "chat"]  # tool_schema: the constrained decode, asked


def _names(allowed: tuple):
    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        if not names or any(n not in allowed for n in names):
            raise argparse.ArgumentTypeError(f"among {', '.join(allowed)}; got {text!r}")
        return names

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from clients.bench.harness import add_serve_arguments

    p.add_argument("--streams", type=positive_ints, default=[1, 4, 8], metavar="K,K", help="1,4,8")
    p.add_argument("--tokens", type=int, default=256, metavar="N", help="reply tokens (256)")
    p.add_argument("--modes", type=_names(MODES), default=["lookup", "auto"], help=",".join(MODES))
    p.add_argument(
        "--traffic",
        type=_names(TRAFFICS),
        default=DEFAULT_TRAFFICS,
        help=",".join(TRAFFICS) + " (tool_schema: held to a JSON schema; not by default)",
    )
    p.add_argument(
        "--lookup-k", type=int, default=4, metavar="K", help="lookup's fixed draft count (4)"
    )
    p.add_argument(
        "--mtp-k", type=int, default=1, metavar="K", help="mtp's drafts per step, chained (1)"
    )
    p.add_argument(
        "--draft-k", type=int, default=3, metavar="K", help="the draft model's fixed K (3)"
    )
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write the figure (matplotlib)")
    add_serve_arguments(p)


def run(args: argparse.Namespace) -> int:
    if not plot_ready(args, "lineage bench speculative"):
        return 1
    from clients.bench.speculative.run import measure

    return emit(measure(args), args, format_table, plot)


COLUMNS = (
    Column("traffic", 9, align="<"),
    Column("streams", 7),
    Column("mode", 12, align="<"),
    Column("tok/s/stream", 12, ".1f"),
    Column("aggregate", 9, ".1f"),
    Column("vs off", 6, ".2f"),
    Column("aggr vs off", 11, ".2f"),
    Column("accept", 6, ".2f"),
    Column("mean len", 8, ".2f"),
    Column("same", 5, align="<"),
)


def format_table(figures: dict) -> str:
    lines = [
        f"model {figures['model']}, {figures['tokens']}-token greedy replies; lookup drafts "
        f"{figures['lookup_k']} tokens a step, the draft model {figures.get('draft_k')} "
        f"({figures.get('draft_model') or 'none'}), auto adapts",
        "",
    ]
    rows = [
        (
            r["traffic"],
            r["streams"],
            r["mode"],
            r["per_stream_tps"],
            r["aggregate_tps"],
            r["per_stream_tps_vs_off"],
            r["aggregate_tps_vs_off"],
            r["acceptance"],
            r["mean_accepted_length"],
            "yes" if r["identical_to_off"] else "NO",
        )
        for r in figures["runs"]
    ]
    lines += table(COLUMNS, rows)
    lines += [
        "",
        "steps (mean ms): verify forward, rollback replay, plain decode step, MTP head; held "
        "rows: their matchers' ms in a verify, drafts their grammar cut",
    ]
    for r in figures["runs"]:
        s = r.get("steps") or {}
        if s:
            lines.append(
                f"  {r['traffic']:<9} {r['streams']} {r['mode']:<12}: {s['verify_steps']} verifies "
                f"{s['verify_ms']:.2f}, {s['replays']} replays {s['replay_ms']:.2f}, "
                f"{s['plain_steps']} plain {s['plain_ms']:.2f}"
                + (f", head {s['head_ms']:.2f}" if s.get("head_ms") else "")
                + (
                    f"; matchers {s['matcher_ms']:.2f} a verify, {s['grammar_cut']} drafts cut"
                    if s.get("grammar_cut") or s.get("matcher_ms")
                    else ""
                )
            )
    return "\n".join(lines)


def plot(figures: dict, path: str) -> None:
    from clients.bench.figures import pyplot, save_figure

    plt = pyplot()
    traffics = list(dict.fromkeys(r["traffic"] for r in figures["runs"]))
    fig, axes = plt.subplots(1, len(traffics), figsize=(5 * len(traffics), 4), squeeze=False)
    for ax, traffic in zip(axes[0], traffics):
        rows = [r for r in figures["runs"] if r["traffic"] == traffic]
        for mode in dict.fromkeys(r["mode"] for r in rows):
            mine = [r for r in rows if r["mode"] == mode]
            xs = [r["streams"] for r in mine]
            ax.plot(xs, [r["per_stream_tps"] for r in mine], marker="o", label=mode)
        ax.set_title(traffic)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("decode tokens/s per stream")
        ax.grid(alpha=0.3)
        ax.legend()
    save_figure(fig, path)
