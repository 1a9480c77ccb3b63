"""`lineage bench kernels`' host-linear part: a prefill of a real model, MLX's matmul vs host.

First one layer alone: a 1024 x 1024 `nn.Linear` over 256 rows in float32,
bfloat16 and float16, on MLX's CPU backend against `HostLinear` (numpy's
BLAS on one thread; the half precisions multiplied in float32), GFLOP/s. Then the model (default:
the embedded tiny qwen3_next, its other kernels installed as the engine runs
it): a prompt of `tokens` tokens prefilled in chunks of L, the caches'
state evaluated after each chunk as the engine's prefill does, with the
model's `nn.Linear` layers on MLX (``stock``) and on the host path
(``host``, engine/kernels/host_linear.py, threshold 1 so every chunk takes
it); and a decode step of B rows, both ways (the engine keeps steps under
`--host-linear-min-rows` on MLX). Each row: both medians, tokens per second,
their ratio, the largest difference of the last position's logits and
whether the argmax agrees.

Cheap to import: MLX and mlx-lm are imported inside the functions.
"""

from __future__ import annotations

import random
import time

from clients.bench.figures import median, median_ms

CHUNKS = (64, 256, 1024)
TOKENS = 1024
DECODE_ROWS = (1, 8)


def matmul_gflops(n: int = 1024, rows: int = 256, repeats: int = 5) -> dict:
    """One n x n linear layer over `rows` rows, per dtype: `nn.Linear` on MLX's CPU backend
    against `HostLinear` (float32 on numpy's BLAS, one thread; half precisions converted)."""
    import mlx.core as mx
    import mlx.nn as nn
    from threadpoolctl import threadpool_limits

    from engine.kernels.host_linear import HostLinear

    flop = 2 * rows * n * n

    def rate(layer, x) -> float:
        mx.eval(layer(x))  # warm
        return flop / median_ms(lambda: mx.eval(layer(x)), repeats) / 1e6

    out = {"n": n, "rows": rows}
    for name in ("float32", "bfloat16", "float16"):
        dtype = getattr(mx, name)
        layer = nn.Linear(n, n, bias=False)
        layer.set_dtype(dtype)
        x = mx.random.normal((rows, n)).astype(dtype)
        mx.eval(layer.parameters(), x)
        mlx_rate = rate(layer, x)
        layer.__class__ = HostLinear
        with threadpool_limits(limits=1, user_api="blas"):
            host_rate = rate(layer, x)
        out[name] = {"mlx_gflops": round(mlx_rate, 1), "host_gflops": round(host_rate, 1)}
    return out


def _prefill_ms(model, ids, chunk: int, repeats: int) -> tuple[float, object]:
    """Median ms of prefilling `ids` in chunks of `chunk`; the last position's logits."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    times, logits = [], None
    for _ in range(repeats + 1):
        cache = make_prompt_cache(model)
        t0 = time.perf_counter()
        for s in range(0, ids.shape[1] - 1, chunk):
            model(ids[:, s : min(s + chunk, ids.shape[1] - 1)], cache=cache)
            mx.eval([c.state for c in cache])
        times.append((time.perf_counter() - t0) * 1000)
        logits = model(ids[:, -1:], cache=cache)[:, -1, :]
        mx.eval(logits)
    return median(times[1:]), logits


def _decode_ms(model, rows: int, repeats: int) -> tuple[float, object]:
    """Median ms of one decode step of `rows` sequences after 256 tokens each; its logits."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.runtime.batching.batch import merge_with_room

    rng = random.Random(rows)
    caches = []
    for _ in range(rows):
        cache = make_prompt_cache(model)
        model(mx.array([[rng.randrange(20, 4000) for _ in range(256)]]), cache=cache)
        mx.eval([c.state for c in cache])
        caches.append(cache)
    cache = merge_with_room(caches, room=repeats + 2)
    tokens = mx.array([[rng.randrange(20, 4000)] for _ in range(rows)])
    times, logits = [], None
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        logits = model(tokens, cache=cache)[:, -1, :]
        mx.eval(logits)
        times.append((time.perf_counter() - t0) * 1000)
    return median(times[1:]), logits


def _compare(label: dict, tokens: int, stock, host) -> dict:
    import mlx.core as mx

    (stock_ms, a), (host_ms, b) = stock, host
    return dict(
        label,
        stock_ms=round(stock_ms, 2),
        host_ms=round(host_ms, 2),
        stock_tok_s=round(tokens / stock_ms * 1000),
        host_tok_s=round(tokens / host_ms * 1000),
        speedup=round(stock_ms / host_ms, 2) if host_ms > 0 else None,
        max_logit_diff=float(mx.abs(a - b).max().item()),
        same_argmax=bool((a.argmax(-1) == b.argmax(-1)).all().item()),
    )


def linear_bench(
    chunks=CHUNKS, tokens: int = TOKENS, decode_rows=DECODE_ROWS, repeats: int = 3, seed: int = 0
) -> dict:
    """The product alone, then the model's prefill per chunk and decode steps, both ways."""
    import mlx.core as mx
    import mlx_lm

    from engine.config import EngineConfig, KernelConfig
    from engine.kernels import host_linear
    from engine.runtime.model.loader import install_kernels
    from engine.runtime.model.tiny_models import ensure_default_model

    product = matmul_gflops()
    print(f"  {_product_line(product)}", flush=True)
    model, _ = mlx_lm.load(str(ensure_default_model()))
    install_kernels(model, EngineConfig(kernels=KernelConfig(host_linear=False)))
    rng = random.Random(seed)
    ids = mx.array([[rng.randrange(20, 4000) for _ in range(tokens)]])
    rows = []

    def both(measure, *args) -> tuple:
        host_linear.uninstall(model)
        stock = measure(model, *args)
        host_linear.install(model, min_rows=1)
        try:
            return stock, measure(model, *args)
        finally:
            host_linear.uninstall(model)

    for chunk in chunks:
        stock, host = both(_prefill_ms, ids, chunk, repeats)
        rows.append(_compare({"prefill_chunk": chunk}, tokens - 1, stock, host))
        print(f"  {_line(rows[-1])}", flush=True)
    for n in decode_rows:
        stock, host = both(_decode_ms, n, repeats * 5)
        rows.append(_compare({"decode_rows": n}, n, stock, host))
        print(f"  {_line(rows[-1])}", flush=True)
    return {"product": product, "tokens": tokens, "rows": rows}


def _product_line(p: dict) -> str:
    parts = []
    for name in ("float32", "bfloat16", "float16"):
        r = p[name]
        ratio = r["host_gflops"] / r["mlx_gflops"] if r["mlx_gflops"] else float("nan")
        parts.append(f"{name} {r['mlx_gflops']} / {r['host_gflops']} (x{ratio:.1f})")
    return f"a {p['n']}x{p['n']} layer over {p['rows']} rows, GFLOP/s MLX / host: " + ", ".join(
        parts
    )


def _line(r: dict) -> str:
    what = (
        f"prefill in chunks of {r['prefill_chunk']:>4}"
        if "prefill_chunk" in r
        else f"decode step of {r['decode_rows']:>2} rows   "
    )
    return (
        f"{what}  stock {r['stock_ms']:8.2f} ms ({r['stock_tok_s']:>5} tok/s)  host "
        f"{r['host_ms']:8.2f} ms ({r['host_tok_s']:>5} tok/s)  x{r['speedup']:.2f}  "
        f"max logit diff {r['max_logit_diff']:.1e}"
        f"{'' if r['same_argmax'] else '  ARGMAX DIFFERS'}"
    )


def report(out: dict) -> list[str]:
    """The report's lines for the host-linear part."""
    return [
        f"host linear, the tiny qwen3_next, a {out['tokens']}-token prompt (MLX's matmul vs "
        "host BLAS):",
        "  " + _product_line(out["product"]),
    ] + ["  " + _line(r) for r in out["rows"]]
