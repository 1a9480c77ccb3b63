"""`lineage bench decode`: tokens per second after the first, layer by layer, beside MLX peers.

For 1, 4 and 8 streams and replies of 256 and 1024 tokens (greedy, raw
prompts of ~60 tokens, so the decode is what is timed), each layer decodes
the same streams:

- `loop`: the model loop alone, in this process (no transport);
- `grpc`: our engine (Ray actors, gRPC front end) through the gRPC client;
- `bridge`: the same engine through its OpenAI bridge (as `lineage serve
  --http-port` starts it), with a streaming HTTP client;
- `mlx_lm.generate`: mlx-lm's own generation on the same model, one stream
  (the forward's cost: the limit here);
- `mlx_lm.server`: a real `mlx_lm.server` process, through the same HTTP client;
- `mlx_vlm.server`, `rapid_mlx`: mlx-vlm's and Rapid-MLX's servers, each from a
  venv of its own (clients.bench.peers; `--install-peers` makes them), through
  the same client (mlx-vlm's has no raw completions: chat completions with
  the same prompt as the user's message). A peer that cannot run here is
  skipped, its reason printed in the table.

With `--rounds R` every (streams, tokens) cell runs the layers in turn R times
(peer, ours, peer, ours: interleaved), and each figure is the median with
the spread (min-max) beside it.

Per layer: mean tokens/s per stream, aggregate tokens/s, the ratio to
`mlx_lm.server` and to the faster of mlx-vlm and Rapid-MLX at the same
streams, and the CPU each process of the server side spent per token (the
front end, the model actor, Ray's daemons, the peer); for the loop and our
servers, the model loop's step split by phase. Every ratio comes from one
run of the bench.
"""

from __future__ import annotations

import argparse

from clients.bench.figures import Column, emit, plot_ready, table
from clients.cli.args import positive_ints

HELP = "decode tokens/s layer by layer (loop, gRPC, bridge) beside mlx_lm, mlx-vlm, Rapid-MLX"
PEER_LAYERS = ("mlx_lm.server", "mlx_vlm.server", "rapid_mlx")
LAYERS = ("loop", "grpc", "bridge", "mlx_lm.generate", *PEER_LAYERS)


def _layers(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in LAYERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"layers are among {', '.join(LAYERS)}; got {text!r}")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    from clients.bench.harness import add_serve_arguments

    p.add_argument("--streams", type=positive_ints, default=[1, 4, 8], metavar="K,K", help="1,4,8")
    p.add_argument(
        "--tokens", type=positive_ints, default=[256, 1024], metavar="N,N", help="256,1024"
    )
    p.add_argument(
        "--layers", type=_layers, default=list(LAYERS), metavar="L,L", help=",".join(LAYERS)
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="each cell's layers run R times, interleaved"
    )
    p.add_argument("--install-peers", action="store_true", help="make the peers' venvs first (pip)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write the figure (matplotlib)")
    add_serve_arguments(p)


def run(args: argparse.Namespace) -> int:
    if not plot_ready(args, "lineage bench decode"):
        return 1
    from clients.bench.decode.run import measure

    figures = measure(args)
    return emit(figures, args, format_table, plot)


# ----------------------------------------------------------------- report ----

COLUMNS = (
    Column("layer", 16, align="<"),
    Column("streams", 7),
    Column("tokens", 6),
    Column("tok/s/stream", 12, ".0f"),
    Column("aggregate", 9, ".0f"),
    Column("spread", 11, align=">"),
    Column("vs server", 9, ".2f"),
    Column("vs peer", 7, ".2f"),
    Column("vs generate", 11, ".2f"),
)


def format_table(figures: dict) -> str:
    lines = [f"model {figures['model']}", ""]
    rows = [
        (
            r["layer"],
            r["streams"],
            r["tokens"],
            r["per_stream_tps"],
            r["aggregate_tps"],
            "{:.0f}-{:.0f}".format(*r.get("aggregate_spread", (r["aggregate_tps"],) * 2)),
            r.get("vs_server", float("nan")),
            r.get("vs_peer", float("nan")),
            r.get("vs_generate", float("nan")),
        )
        for r in figures["runs"]
    ]
    lines += table(COLUMNS, rows)
    for name, reason in figures.get("skipped", {}).items():
        lines.append(f"{name}: skipped: {reason}")
    if figures.get("load_average"):
        lines.append("load average (1, 5, 15 min) at the start and the end: {}".format(
            " / ".join(", ".join(f"{v:.2f}" for v in la) for la in figures["load_average"])
        ))  # fmt: skip
    lines += ["", "CPU ms per decoded token, by process (server side; the client apart):"]
    for r in figures["runs"]:
        if r["cpu_ms_per_token"]:
            parts = ", ".join(f"{k} {v:.3f}" for k, v in r["cpu_ms_per_token"].items())
            lines.append(f"  {r['layer']:<16} {r['streams']}x{r['tokens']}: {parts}")
    lines += [
        "",
        "model loop step (mean ms by phase; `decode` is mlx-lm's step: the forward and the",
        "sampling; `emit` hands the events over; detokenizing and stop strings are the front",
        "end's CPU above):",
    ]
    for r in figures["runs"]:
        steps = r.get("steps") or {}
        if steps.get("steps"):
            phases = ", ".join(f"{k} {v:.3f}" for k, v in steps["mean_ms"].items() if v)
            lines.append(
                f"  {r['layer']:<16} {r['streams']}x{r['tokens']}: p50 "
                f"{steps['total_ms_p50']:.3f} ms over {steps['steps']} steps; {phases}"
            )
            bare = steps.get("bare_ms")
            if bare:
                lines.append(
                    f"  {'':<16} bare, in process: forward {bare['forward']:.3f} ms, "
                    f"sampling {bare['sample']:.3f} ms"
                )
    return "\n".join(lines)


def plot(figures: dict, path: str) -> None:
    from clients.bench.figures import pyplot, save_figure

    plt = pyplot()
    token_counts = sorted({r["tokens"] for r in figures["runs"]})
    fig, axes = plt.subplots(
        1, len(token_counts), figsize=(6 * len(token_counts), 4), squeeze=False
    )
    for ax, n in zip(axes[0], token_counts):
        for layer in LAYERS:
            rows = [r for r in figures["runs"] if r["layer"] == layer and r["tokens"] == n]
            if rows:
                xs = [r["streams"] for r in rows]
                ax.plot(xs, [r["aggregate_tps"] for r in rows], marker="o", label=layer)
        ax.set_title(f"{n}-token replies")
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("aggregate tokens/s")
        ax.grid(alpha=0.3)
        ax.legend()
    save_figure(fig, path)
