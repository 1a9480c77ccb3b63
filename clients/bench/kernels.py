"""`lineage bench kernels`: the engine/kernels/ paths against mlx-lm's stock ones.

Four measurements in one run:
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
  context and chunk length, MLX's attention against the host-BLAS path.

Cheap to import: MLX, mlx-lm and matplotlib are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

HELP = "sparse-attention, gated-delta and dense-attention kernels against the stock paths"
CHUNKS = (1, 2, 16, 64, 128, 256, 512, 1024)


def _timed(fn, repeats: int) -> float:
    """Median ms of `repeats` calls of fn (each evaluates its result)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


# ------------------------------------------------------------- one layer ----


def _layer(context: int, heads: int, seed: int):
    """A random-weight DSA attention layer (DeepSeek-V3.2 per-head dims, fewer heads)."""
    import mlx.core as mx
    from mlx_lm.models.deepseek_v32 import DeepseekV32Attention, ModelArgs

    args = ModelArgs(
        hidden_size=1024,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        q_lora_rank=512,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        index_n_heads=max(1, heads // 2),  # V3.2: 128 heads over 64 indexer heads
        index_head_dim=128,
        index_topk=context // 8,
        max_position_embeddings=4 * context,
    )
    mx.random.seed(seed)
    attn = DeepseekV32Attention(args)
    mx.eval(attn.parameters())
    return attn


def _filled_cache(attn, context: int, seed: int, hot=None):
    """The layer's cache after `context` tokens of random hidden states.

    Written with the layer's own projections, norms and rope, chunk by chunk,
    without attending (the attention output of the prefix is not needed).
    `hot` (a `Clustering`) adds its shared component to the hidden states of
    its hot positions.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import CacheList, KVCache

    cache = CacheList(KVCache(), KVCache())
    mx.random.seed(seed)
    for start in range(0, context, 2048):
        x = mx.random.normal((1, min(2048, context - start), attn.hidden_size))
        B, L, _ = x.shape
        if hot is not None:
            x = x + hot.offset(start, L)
        ckv, k_pe = mx.split(attn.kv_a_proj_with_mqa(x), [attn.kv_lora_rank], axis=-1)
        k_pe = attn.rope(k_pe.reshape(B, L, 1, -1).transpose(0, 2, 1, 3), cache[0].offset)
        latent = mx.expand_dims(attn.kv_a_layernorm(ckv), axis=1)
        cache[0].update_and_fetch(latent, k_pe)
        ix = attn.indexer
        k = ix.rope(ix.k_norm(ix.wk(x)).reshape(B, 1, L, -1), offset=cache[1].offset)
        cache[1].update_and_fetch(k, mx.zeros_like(k))
        mx.eval([c.state for c in cache.caches])
    return cache


class Clustering:
    """Indexer selections that cluster, as a trained DSA model's do.

    With random weights every query's top-k is spread over the whole context,
    so the union of a chunk's selected blocks is all of it and block-gather
    never pays. A trained indexer keeps to attention sinks, a recent window
    and a few topic spans, and neighbouring queries agree. This builds that
    from the layer's own modules: a shared direction `e` in the hidden states
    of the *hot* tokens (the first block, the last `topk // 2` positions, and
    random 64-token blocks up to 1.25x topk in all) and of every chunk token;
    the indexer's parameters are shifted so that tokens carrying `e` get
    positive head weights, queries and keys share a direction `u` outside the
    rope dims, and so score each other highly. Nothing else in the layer
    changes; the forward runs unmodified code on these weights and inputs.
    """

    STRENGTH = 8.0  # the shared component's norm (a random hidden state's is ~sqrt(hidden))

    def __init__(self, attn, context: int, seed: int):
        import mlx.core as mx
        import numpy as np

        ix = attn.indexer
        mx.random.seed(seed)
        e = mx.random.normal((attn.hidden_size,))
        self.e = e / mx.linalg.norm(e)
        v = mx.random.normal((ix.head_dim - ix.rope_head_dim,))
        v = (v - v.mean()) / mx.linalg.norm(v - v.mean())  # zero mean: survives k_norm
        u = mx.concatenate([mx.zeros((ix.rope_head_dim,)), v])  # outside the rope dims
        g = attn.q_a_proj(self.e[None])[0]
        g = g / mx.linalg.norm(g)  # the direction e takes after q_a_proj
        ix.weights_proj.weight = ix.weights_proj.weight + self.e[None, :]
        wq = ix.wq_b.weight.reshape(ix.n_heads, ix.head_dim, -1)
        ix.wq_b.weight = (wq + 2.0 * u[None, :, None] * g[None, None, :]).reshape(
            ix.n_heads * ix.head_dim, -1
        )
        ix.wk.weight = ix.wk.weight + (20.0 / self.STRENGTH) * u[:, None] * self.e[None, :]
        mx.eval(attn.parameters())

        topk, block = ix.index_topk, 64
        rng = np.random.default_rng(seed)
        hot = np.zeros(context, dtype=bool)
        hot[:block] = True  # attention sinks
        hot[context - topk // 2 :] = True  # the recent window
        n_blocks = context // block
        inner = np.arange(1, n_blocks - topk // 2 // block)
        spans = (int(1.25 * topk) - int(hot.sum())) // block
        for b in rng.choice(inner, size=max(0, min(spans, inner.size)), replace=False):
            hot[b * block : (b + 1) * block] = True
        self.hot = hot

    def offset(self, start: int, length: int):
        """The shared component for positions start..start+length of the context."""
        import mlx.core as mx

        hot = mx.array(self.hot[start : start + length].astype("float32"))
        return self.STRENGTH * hot[None, :, None] * self.e

    def chunk(self, x):
        """A chunk's hidden states: every new token carries the shared component."""
        return x + self.STRENGTH * self.e


def _view(cache):
    """A cache over the same rows that the forward can append to without touching `cache`."""
    from mlx_lm.models.cache import CacheList, KVCache

    out = CacheList(KVCache(), KVCache())
    for mine, theirs in zip(out.caches, cache.caches):
        n = theirs.offset
        mine.keys, mine.values = theirs.keys[..., :n, :], theirs.values[..., :n, :]
        mine.offset = n
    return out


def layer_bench(
    context: int,
    heads: int,
    repeats: int,
    chunks=CHUNKS,
    seed: int = 0,
    clustered: bool = False,
    both_paths: bool = False,
) -> dict:
    """ms per forward, stock against ours, per chunk length (module doc).

    `clustered` builds the layer and cache with `Clustering`; `both_paths`
    also times, for chunks in the block-gather range, the path the router
    did not take (block-gather or the decode shape) on its own.
    """
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.base import create_attention_mask

    from engine.kernels import sparse_attention as sa

    attn = _layer(context, heads, seed)
    hot = Clustering(attn, context, seed + 2) if clustered else None
    cache = _filled_cache(attn, context, seed + 1, hot)
    sa.install(nn.Sequential(attn), sa.SparsePlan())
    rows = []
    for L in chunks:
        mx.random.seed(seed + L)
        x = mx.random.normal((1, L, attn.hidden_size))
        if hot is not None:
            x = hot.chunk(x)
        mx.eval(x)

        def forward(call, x=x):
            c = _view(cache)
            out = call(x, create_attention_mask(x, c[0], return_array=True), c)
            mx.eval(out)
            return out

        stock_out, before = forward(attn._stock_call), dict(sa.ROUTED)
        ours_out = forward(attn)
        path = next(k for k, v in sa.ROUTED.items() if v != before.get(k, 0))
        rel = _rel(ours_out, stock_out)
        union = _union_fraction(attn, x, cache, L)
        stock_ms = _timed(lambda: forward(attn._stock_call), repeats)
        ours_ms = _timed(lambda: forward(attn), repeats)
        row = {
            "chunk": L,
            "stock_ms": stock_ms,
            "ours_ms": ours_ms,
            "speedup": stock_ms / ours_ms,
            "path": path,
            "rel_l2": rel,
            "block_union": union,
        }
        plan = sa.SparsePlan()
        if both_paths and plan.decode_max < L <= plan.gather_max:
            other = "decode" if path == "gather" else "gather"
            with _forced(sa, other):
                taken = sa.ROUTED[other]
                forced_out = forward(attn)
                assert sa.ROUTED[other] == taken + 1, (other, dict(sa.ROUTED))
                row["forced"] = {
                    "path": other,
                    "ms": _timed(lambda: forward(attn), repeats),
                    "rel_l2": _rel(forced_out, stock_out),
                }
        rows.append(row)
        print(
            f"  L={L:5d}  stock {stock_ms:9.1f} ms  ours {ours_ms:9.1f} ms  "
            f"x{stock_ms / ours_ms:6.2f}  {path:6s}  rel L2 {rel:.1e}"
            + (f"  {other} alone {row['forced']['ms']:9.1f} ms" if "forced" in row else ""),
            flush=True,
        )
    return {
        "context": context,
        "index_topk": attn.indexer.index_topk,
        "heads": heads,
        "index_heads": attn.indexer.n_heads,
        "kv_lora_rank": attn.kv_lora_rank,
        "repeats": repeats,
        "selections": "clustered" if clustered else "random",
        "rows": rows,
    }


def _rel(a, b) -> float:
    import mlx.core as mx

    return (mx.linalg.norm((a - b).flatten()) / mx.linalg.norm(b.flatten())).item()


@contextlib.contextmanager
def _forced(sa, path: str):
    """Within: chunks in the block-gather range take `path` ("decode" or "gather")."""
    pays = sa.gather_pays
    sa.gather_pays = lambda *a: path == "gather"
    try:
        yield
    finally:
        sa.gather_pays = pays


def _union_fraction(attn, x, cache, L: int) -> float | None:
    """Share of the context's 64-token blocks the chunk's queries select (block-gather sizes)."""
    import mlx.core as mx
    from mlx_lm.models.base import create_attention_mask

    from engine.kernels import sparse_attention as sa

    if not 128 < L <= 512:
        return None
    c = _view(cache)
    mask = create_attention_mask(x, c[0], return_array=True)
    qr = attn.q_a_layernorm(attn.q_a_proj(x))
    topk = attn.indexer(x, qr, mask, cache=c[1])
    n = c[1].offset
    blocks = sa.selected_blocks(topk, n, 64)
    mx.eval(blocks)
    return blocks.shape[1] / -(-n // 64)


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
    import numpy as np

    from engine.config import CacheConfig, EngineConfig, ModelConfig
    from engine.runtime.local import LocalEngine
    from engine.runtime.tiny_models import write_model_dir

    out = {}
    with tempfile.TemporaryDirectory(prefix="lineage-bench-kernels-") as tmp:
        model_dir = write_model_dir("glm_moe_dsa", Path(tmp) / "model", size="bench")
        flag = Path(tmp) / "timer-on"
        for label, sparse in (("before", False), ("after", True)):
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
                            "layer_timer": [_parse_timer(x) for x in handler.lines]
                            if timed
                            else [],
                        }
                    )
                    convo = prompt + r.ids
            finally:
                logging.getLogger("lineage.layers").removeHandler(handler)
            kernels = engine.info.kernels
            untimed = rows[:-1] or rows
            out[label] = {
                "kernels": list(kernels),
                "ttft_ms": statistics.median(r["ttft_ms"] for r in untimed),
                "decode_step_ms": statistics.median(r["decode_step_ms"] for r in untimed),
                "cached_tokens": rows[-1]["cached_tokens"],
                "prompt_tokens": rows[-1]["prompt_tokens"],
                "timed_turn": rows[-1],
            }
            out[label]["ttft_per_decode_step"] = (
                out[label]["ttft_ms"] / out[label]["decode_step_ms"]
            )
    return out


# ------------------------------------------------------------ gated delta ----


def gated_delta_bench(repeats: int, steps=(1, 16, 128, 512)) -> list:
    """ms per call: mlx-lm's op loop against mx.fast.gated_delta_update (qwen3_next dims)."""
    import mlx.core as mx
    from mlx_lm.models.gated_delta import gated_delta_ops

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

        ops(), fast()
        y0, s0 = gated_delta_ops(q, k, v, g, beta, state)
        y1, s1 = mx.fast.gated_delta_update(q, k, v, g, beta, state)
        rows.append(
            {
                "steps": T,
                "ops_ms": _timed(ops, repeats),
                "fast_ms": _timed(fast, repeats),
                "bit_identical": bool(mx.array_equal(y0, y1) and mx.array_equal(s0, s1)),
            }
        )
        rows[-1]["speedup"] = rows[-1]["ops_ms"] / rows[-1]["fast_ms"]
    return rows


# ----------------------------------------------------------------- output ----


def report(out: dict) -> str:
    lay = out.get("layer")
    lines = (
        []
        if lay is None
        else [
            f"one DSA layer: context {lay['context']}, index_topk {lay['index_topk']} "
            f"(context/topk {lay['context'] / lay['index_topk']:.0f}), {lay['heads']} heads, "
            f"{lay['index_heads']} indexer heads, latent {lay['kv_lora_rank']}; "
            f"{lay['selections']} selections; median of {lay['repeats']}",
            "      L    stock ms     ours ms   speedup  path    rel L2   block union",
        ]
    )
    for r in lay["rows"] if lay else ():
        union = f"{r['block_union']:.0%}" if r["block_union"] is not None else "-"
        lines.append(
            f"  {r['chunk']:5d}  {r['stock_ms']:10.1f}  {r['ours_ms']:10.1f}  "
            f"{r['speedup']:7.2f}x  {r['path']:6s}  {r['rel_l2']:.1e}  {union:>6s}"
        )
        forced = r.get("forced")
        if forced:
            lines.append(
                f"         {forced['path']} alone: {forced['ms']:10.1f} ms  "
                f"{r['stock_ms'] / forced['ms']:7.2f}x  rel L2 {forced['rel_l2']:.1e}"
            )
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
        from clients.bench.dense_kernel import report as dense_report

        lines += dense_report(out["dense"])
    gd = out.get("gated_delta")
    if gd:
        lines.append("gated delta, ms per call (B=1, 16/32 heads, 128x128): op loop vs mx.fast")
        for r in gd:
            lines.append(
                f"  T={r['steps']:4d}  ops {r['ops_ms']:8.1f}  fast {r['fast_ms']:8.1f}  "
                f"x{r['speedup']:5.2f}  bit-identical {r['bit_identical']}"
            )
    return "\n".join(lines)


def plot(out: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
        from clients.bench.dense_kernel import dense_bench

        print("dense attention:", flush=True)
        out["dense"] = dense_bench(tuple(args.dense_contexts), tuple(args.dense_chunks))
    print(report(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    if args.plot and "layer" in out:
        plot(out, args.plot)
    return 0
