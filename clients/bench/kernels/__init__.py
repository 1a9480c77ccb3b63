"""`lineage bench kernels`: the engine/kernels/ paths against mlx-lm's stock ones.

Five measurements in one run:
- **one sparse-attention layer** (mlx-lm's ``DeepseekV32Attention``, random
  weights, no model load) at a long context with ``index_topk`` scaled so the
  context is 8x it: ms per forward of a chunk of L tokens on that cache, for L
  in 1..1024, stock against ours, the path ours took, the union of selected
  blocks for block-gather lengths, and the relative L2 between the two.
  ``--selections clustered`` gives the indexer the selections of a trained
  model (`Clustering`: sinks, a recent window, topic spans), where
  block-gather pays; random weights' selections cover the whole context;
- **whole warm turns** on the tiny DSA model (glm_moe_dsa, "bench" size) at a
  long context, with the kernels off (before) and on (after): time to first
  token, the decode step, and the per-layer timer's breakdown of the warm
  prefill forward;
- **gated delta**: mlx-lm's per-token op loop against
  ``mx.fast.gated_delta_update`` (the ground for ``--gated-delta auto``);
- **dense attention** (`dense_kernel`): one forward of the tiny qwen3_next per
  context and chunk length, MLX's attention against the host-BLAS path;
- **host linear** (`linear_kernel`): one matmul, then the tiny qwen3_next's
  prefill per chunk length and decode steps, MLX's matmul against the host BLAS.

The layer lives in `sparse_layer`, the dense part in `dense_kernel`, the
linear part in `linear_kernel`; this module runs the rest and reports all
five. Cheap to import: MLX, mlx-lm and matplotlib are imported inside the
functions.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from clients.bench.figures import (
    Column,
    emit,
    median,
    median_ms,
    plot_ready,
    pyplot,
    save_figure,
    table_header,
    table_row,
)
from clients.bench.kernels import dense as dense_kernel
from clients.bench.kernels import linear as linear_kernel
from clients.bench.kernels.sparse import CHUNKS, layer_bench

HELP = (
    "sparse-attention, gated-delta, dense-attention and host-linear kernels against the stock paths"
)


# ------------------------------------------------------- whole warm turns ----


class _TimerLines(logging.Handler):
    """Collects the per-layer timer's log lines."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _parse_timer(line: str) -> dict:
    """'layer_timer requests=.. total_ms=.. 0:Name=ms ..' -> {total_ms, layers: {i: ms}}."""
    parts = line.split()
    total = float(next(p for p in parts if p.startswith("total_ms=")).split("=")[1])
    layers = {}
    for p in parts[3:]:
        key, ms = p.rsplit("=", 1)
        layers[key] = float(ms)
    return {"total_ms": total, "layers": layers}


def warm_turn_bench(context: int, new_tokens: int, decode_tokens: int, turns: int, seed=0):
    """Warm turns on the bench-size tiny glm_moe_dsa, kernels off then on."""
    from engine.runtime.model.tiny_models import write_model_dir

    out = {}
    with tempfile.TemporaryDirectory(prefix="lineage-bench-kernels-") as tmp:
        model_dir = write_model_dir("glm_moe_dsa", Path(tmp) / "model", size="bench")
        for label, sparse in (("before", False), ("after", True)):
            out[label] = _warm_side(
                model_dir, tmp, sparse, context, new_tokens, decode_tokens, turns, seed
            )
    return out


def _warm_side(model_dir, tmp, sparse, context, new_tokens, decode_tokens, turns, seed) -> dict:
    """One side of warm_turn_bench: an engine with the sparse kernels on or off, its warm
    turns (medians over all but the last), and the per-layer timer of the last one."""
    import numpy as np

    from engine.config import CacheConfig, EngineConfig, ModelConfig
    from engine.runtime.local import LocalEngine

    flag = Path(tmp) / "timer-on"
    config = EngineConfig(
        model=ModelConfig(path=str(model_dir), max_batch=1),
        cache=CacheConfig(
            cache_dir=tmp,
            ram_budget=4 << 30,
            layer_timer_flag=str(flag),
            layer_timer_requests=1,
        ),
    ).with_kernels(sparse=sparse)
    engine = LocalEngine(config)
    vocab = engine.info.vocab_size
    rng = np.random.default_rng(seed)
    convo = [int(t) for t in rng.integers(10, vocab - 10, size=context)]
    convo += engine.run(convo, max_tokens=2).ids
    handler = _TimerLines()
    logging.getLogger("lineage.layers").addHandler(handler)
    logging.getLogger("lineage.layers").setLevel(logging.INFO)
    rows = []
    try:
        for turn in range(turns):
            prompt = convo + [int(t) for t in rng.integers(10, vocab - 10, size=new_tokens)]
            timed = turn == turns - 1
            if timed:
                flag.touch()
            handler.lines.clear()
            t0 = time.perf_counter()
            r = engine.run(prompt, max_tokens=decode_tokens + 1)
            total_ms = (time.perf_counter() - t0) * 1000
            flag.unlink(missing_ok=True)
            rows.append(
                {
                    "prompt_tokens": len(prompt),
                    "cached_tokens": r.final.cached_tokens,
                    "ttft_ms": r.ttft_ms,
                    "decode_step_ms": (total_ms - r.ttft_ms) / max(1, len(r.ids) - 1),
                    "layer_timer": [_parse_timer(x) for x in handler.lines] if timed else [],
                }
            )
            convo = prompt + r.ids
    finally:
        logging.getLogger("lineage.layers").removeHandler(handler)
    untimed = rows[:-1] or rows
    side = {
        "kernels": list(engine.info.kernels),
        "ttft_ms": median(r["ttft_ms"] for r in untimed),
        "decode_step_ms": median(r["decode_step_ms"] for r in untimed),
        "cached_tokens": rows[-1]["cached_tokens"],
        "prompt_tokens": rows[-1]["prompt_tokens"],
        "timed_turn": rows[-1],
    }
    side["ttft_per_decode_step"] = side["ttft_ms"] / side["decode_step_ms"]
    return side


# ------------------------------------------------------------ gated delta ----


def gated_delta_bench(repeats: int, steps=(1, 16, 128, 512)) -> list:
    """ms per call: mlx-lm's op loop against mx.fast.gated_delta_update and the host
    recurrence (engine/kernels/gated_delta.py), at qwen3_next's dims."""
    import mlx.core as mx
    from mlx_lm.models.gated_delta import gated_delta_ops

    from engine.kernels.gated_delta import host_recurrence

    rows = []
    B, Hk, Hv, Dk, Dv = 1, 16, 32, 128, 128
    for T in steps:
        mx.random.seed(T)
        q = mx.random.normal((B, T, Hk, Dk)) * 0.1
        k = mx.random.normal((B, T, Hk, Dk)) * 0.1
        v = mx.random.normal((B, T, Hv, Dv))
        g = mx.random.uniform(0.8, 1.0, (B, T, Hv))
        beta = mx.random.uniform(0.0, 1.0, (B, T, Hv))
        state = mx.random.normal((B, Hv, Dv, Dk)) * 0.1
        mx.eval(q, k, v, g, beta, state)
        inputs = (q, k, v, g, beta, state)

        def ops(inputs=inputs):
            mx.eval(gated_delta_ops(*inputs))

        def fast(inputs=inputs):
            mx.eval(mx.fast.gated_delta_update(*inputs))

        def host(inputs=inputs):
            mx.eval(host_recurrence(*inputs))

        ops(), fast(), host()
        y0, s0 = gated_delta_ops(q, k, v, g, beta, state)
        y1, s1 = mx.fast.gated_delta_update(q, k, v, g, beta, state)
        y2, s2 = host_recurrence(q, k, v, g, beta, state)
        rows.append(
            {
                "steps": T,
                "ops_ms": median_ms(ops, repeats),
                "fast_ms": median_ms(fast, repeats),
                "host_ms": median_ms(host, repeats),
                "bit_identical": bool(mx.array_equal(y0, y1) and mx.array_equal(s0, s1)),
                "host_max_diff": float(
                    max(mx.abs(y2 - y0).max().item(), mx.abs(s2 - s0).max().item())
                ),
            }
        )
        rows[-1]["speedup"] = rows[-1]["ops_ms"] / rows[-1]["fast_ms"]
        rows[-1]["host_speedup"] = rows[-1]["fast_ms"] / rows[-1]["host_ms"]
    return rows


# ----------------------------------------------------------------- output ----


LAYER_COLUMNS = (
    Column("L", 5, "d"),
    Column("stock ms", 10, ".1f", gap=2),
    Column("ours ms", 10, ".1f", gap=2),
    Column("speedup", 8, gap=2),
    Column("path", 6, align="<", gap=2),
    Column("rel L2", 7, ".1e", align="<", gap=2),
    Column("block union", 6, gap=2),
)


def report(out: dict) -> str:
    lines = _layer_lines(out["layer"]) if out.get("layer") else []
    warm = out.get("warm")
    if warm:
        b, a = warm["before"], warm["after"]
        lines += [
            f"warm turns on tiny glm_moe_dsa (bench size): {a['prompt_tokens']} tokens, "
            f"{a['prompt_tokens'] - a['cached_tokens']} uncached per turn",
            f"  before (stock):  ttft {b['ttft_ms']:8.1f} ms  decode step "
            f"{b['decode_step_ms']:6.1f} ms  ttft/step {b['ttft_per_decode_step']:5.1f}",
            f"  after ({', '.join(a['kernels']) or 'none'}):  ttft {a['ttft_ms']:8.1f} ms  "
            f"decode step {a['decode_step_ms']:6.1f} ms  "
            f"ttft/step {a['ttft_per_decode_step']:5.1f}",
        ]
        for label, side in (("before", b), ("after", a)):
            forwards = side["timed_turn"]["layer_timer"]
            if forwards:
                first = forwards[0]
                layers = " ".join(f"{k}={v:.1f}" for k, v in first["layers"].items())
                lines.append(
                    f"  layer timer, {label}, warm prefill forward: "
                    f"{first['total_ms']:.1f} ms ({layers})"
                )
    if out.get("dense"):
        lines += dense_kernel.report(out["dense"])
    if out.get("linear"):
        lines += linear_kernel.report(out["linear"])
    gd = out.get("gated_delta")
    if gd:
        lines.append(
            "gated delta, ms per call (B=1, 16/32 heads, 128x128): op loop vs mx.fast vs host"
        )
        for r in gd:
            lines.append(
                f"  T={r['steps']:4d}  ops {r['ops_ms']:8.1f}  fast {r['fast_ms']:8.1f}  "
                f"x{r['speedup']:5.2f}  bit-identical {r['bit_identical']}  "
                f"host {r['host_ms']:8.1f}  x{r['host_speedup']:5.2f} of fast  "
                f"max diff {r['host_max_diff']:.1e}"
            )
    return "\n".join(lines)


def _layer_lines(lay: dict) -> list[str]:
    """The layer's figures: a row per chunk length, and the forced path under its row."""
    lines = [
        f"one DSA layer: context {lay['context']}, index_topk {lay['index_topk']} "
        f"(context/topk {lay['context'] / lay['index_topk']:.0f}), {lay['heads']} heads, "
        f"{lay['index_heads']} indexer heads, latent {lay['kv_lora_rank']}; "
        f"{lay['selections']} selections; median of {lay['repeats']}",
        table_header(LAYER_COLUMNS, indent="  "),
    ]
    for r in lay["rows"]:
        union = f"{r['block_union']:.0%}" if r["block_union"] is not None else "-"
        values = (r["chunk"], r["stock_ms"], r["ours_ms"], f"{r['speedup']:.2f}x", r["path"])
        lines.append(table_row(LAYER_COLUMNS, (*values, r["rel_l2"], union), indent="  "))
        forced = r.get("forced")
        if forced:
            lines.append(
                f"         {forced['path']} alone: {forced['ms']:10.1f} ms  "
                f"{r['stock_ms'] / forced['ms']:7.2f}x  rel L2 {forced['rel_l2']:.1e}"
            )
    return lines


def plot(out: dict, path: str) -> None:
    """ms per forward and speedup per chunk length of the layer (nothing without it)."""
    if "layer" not in out:
        return
    plt = pyplot()
    rows = out["layer"]["rows"]
    chunks = [r["chunk"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(chunks, [r["stock_ms"] for r in rows], "o-", label="mlx-lm stock")
    left.plot(chunks, [r["ours_ms"] for r in rows], "s-", label="engine/kernels")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("chunk length L (tokens)")
    left.set_ylabel("ms per forward")
    lay = out["layer"]
    left.set_title(f"one DSA layer, context {lay['context']}, topk {lay['index_topk']}")
    left.legend()
    right.bar([str(c) for c in chunks], [r["speedup"] for r in rows], color="tab:green")
    right.axhline(1.0, color="grey", lw=0.8)
    right.set_yscale("log")
    for i, r in enumerate(rows):
        right.annotate(f"{r['speedup']:.1f}x", (i, r["speedup"]), ha="center", va="bottom")
    right.set_xlabel("chunk length L (tokens)")
    right.set_ylabel("speedup over stock")
    right.set_title("stock ms / ours ms")
    save_figure(fig, path, dpi=120)


def add_arguments(p) -> None:
    p.add_argument("--context", type=int, default=16384, help="layer cache length (topk = /8)")
    p.add_argument("--heads", type=int, default=8, help="attention heads of the layer")
    p.add_argument("--repeats", type=int, default=2, help="timed forwards per point (median)")
    p.add_argument("--chunks", type=int, nargs="+", default=list(CHUNKS), metavar="L")
    p.add_argument(
        "--selections",
        choices=("random", "clustered"),
        default="random",
        help="indexer selections of the layer: random weights', or clustered as a trained "
        "model's (sinks, a recent window, topic spans)",
    )
    p.add_argument(
        "--both-paths",
        action="store_true",
        help="for chunks in the block-gather range, also time the path the router did not take",
    )
    p.add_argument("--skip-gated-delta", action="store_true", help="no gated-delta figures")
    p.add_argument("--warm-context", type=int, default=4096, help="warm-turn conversation")
    p.add_argument("--new-tokens", type=int, default=40, help="new tokens per warm turn")
    p.add_argument("--decode-tokens", type=int, default=16, help="decode steps timed per turn")
    p.add_argument("--turns", type=int, default=3, help="warm turns per side (last one timed)")
    p.add_argument("--skip-warm", action="store_true", help="the layer measurement only")
    p.add_argument("--skip-layer", action="store_true", help="no DSA layer figures")
    p.add_argument("--skip-dense", action="store_true", help="no dense-attention figures")
    p.add_argument("--skip-linear", action="store_true", help="no host-linear figures")
    p.add_argument(
        "--linear-chunks", type=int, nargs="+", default=list(linear_kernel.CHUNKS), metavar="L",
        help="prefill chunk lengths of the host-linear figures",
    )  # fmt: skip
    p.add_argument(
        "--dense-contexts", type=int, nargs="+", default=[0, 2048, 8192], metavar="N",
        help="contexts of the dense-attention forwards (32768 takes minutes to fill)",
    )  # fmt: skip
    p.add_argument(
        "--dense-chunks", type=int, nargs="+", default=[1, 4, 16, 64], metavar="L",
        help="chunk lengths of the dense-attention forwards",
    )  # fmt: skip
    p.add_argument("--json", metavar="FILE", help="write the figures to this file")
    p.add_argument("--plot", metavar="FILE.png", help="draw ms/forward and speedup per L")


def run(args) -> int:
    if not plot_ready(args, "lineage bench kernels"):
        return 1
    out = {}
    if not args.skip_layer:
        print("one sparse-attention layer:", flush=True)
        out["layer"] = layer_bench(
            args.context,
            args.heads,
            args.repeats,
            tuple(args.chunks),
            clustered=args.selections == "clustered",
            both_paths=args.both_paths,
        )
    if not args.skip_warm:
        print("warm turns:", flush=True)
        out["warm"] = warm_turn_bench(
            args.warm_context, args.new_tokens, args.decode_tokens, args.turns
        )
    if not args.skip_gated_delta:
        print("gated delta:", flush=True)
        out["gated_delta"] = gated_delta_bench(args.repeats)
    if not args.skip_dense:
        print("dense attention:", flush=True)
        out["dense"] = dense_kernel.dense_bench(
            tuple(args.dense_contexts), tuple(args.dense_chunks)
        )
    if not args.skip_linear:
        print("host linear:", flush=True)
        out["linear"] = linear_kernel.linear_bench(tuple(args.linear_chunks))
    return emit(out, args, report, plot)
