"""`lineage bench kernels`' dense-attention part: one forward of a real model, stock vs host.

The model (default: the embedded tiny qwen3_next) is loaded once; for each
context it is prefilled to that many tokens, its caches merged into the batch
form the engine's model loop uses (`merge_with_room`: ``BatchKVCache``, whose
masks are boolean arrays), and one forward of a chunk of L new tokens is
timed with MLX's attention (``stock``) and with the host path (``host``,
engine/kernels/dense_attention.py, installed with threshold 1 so every
attention call takes it), the caches trimmed back after each forward. The
last row is a decode step of a left-padded batch of three sequences at
different contexts. Each row reports both medians, their ratio and the
largest logit difference between the two at the same inputs.

Cheap to import: MLX and mlx-lm are imported inside the functions.
"""

from __future__ import annotations

import time

from clients.bench.figures import median

CONTEXTS = (0, 2048, 8192)
CHUNKS = (1, 4, 16, 64)
FILL = 512  # tokens per prefill forward while filling a context


def _model():
    import mlx_lm

    from engine.runtime.model.tiny_models import ensure_default_model

    model, _ = mlx_lm.load(str(ensure_default_model()))
    return model


def _filled(model, contexts: list[int], seed: int):
    """Merged batch caches of len(contexts) sequences prefilled to those lengths."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.kernels import dense_attention
    from engine.runtime.batching.batch import merge_with_room

    rng = mx.random.key(seed)
    caches = []
    dense_attention.install(model, min_keys=1)  # the faster fill; not timed
    for n in contexts:
        cache = make_prompt_cache(model)
        ids = mx.random.randint(20, 4000, (1, max(n, 1)), key=rng)
        for s in range(0, n, FILL):
            model(ids[:, s : s + FILL], cache=cache)
            mx.eval([c.state for c in cache])
        caches.append(cache)
    dense_attention.uninstall(model)
    merged = merge_with_room(caches, room=128)
    mx.eval([c.state for c in merged])
    return merged


def _forward_ms(model, cache, tokens, repeats: int) -> tuple[float, object]:
    """Median ms of one forward of `tokens` on `cache` (put back after each); its logits."""
    import mlx.core as mx

    # The state layers (ArraysCache) get a fresh list each time: the model writes into it.
    saved = [None if c.is_trimmable() else list(c.cache) for c in cache]
    times, logits = [], None
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        logits = model(tokens, cache=cache)
        mx.eval(logits)
        times.append((time.perf_counter() - t0) * 1000)
        for c, state in zip(cache, saved):
            if state is None:
                c.trim(tokens.shape[1])
            else:
                c.cache = list(state)
    return median(times[1:]), logits


def _row(model, cache, tokens, repeats: int, label: dict) -> dict:
    import mlx.core as mx

    from engine.kernels import dense_attention

    dense_attention.uninstall(model)
    stock_ms, stock = _forward_ms(model, cache, tokens, repeats)
    dense_attention.install(model, min_keys=1)
    try:
        host_ms, host = _forward_ms(model, cache, tokens, repeats)
    finally:
        dense_attention.uninstall(model)
    row = dict(label)
    row.update(
        stock_ms=round(stock_ms, 3),
        host_ms=round(host_ms, 3),
        speedup=round(stock_ms / host_ms, 2) if host_ms > 0 else None,
        max_logit_diff=float(mx.abs(stock - host).max().item()),
        same_argmax=bool((stock.argmax(-1) == host.argmax(-1)).all().item()),
    )
    return row


def dense_bench(contexts=CONTEXTS, chunks=CHUNKS, repeats: int = 5, seed: int = 0) -> list:
    """One row per (context, chunk): ms per forward stock and host, their ratio, logit diff."""
    import mlx.core as mx

    model = _model()
    rows = []
    for context in contexts:
        cache = _filled(model, [context], seed)
        for chunk in chunks:
            tokens = mx.random.randint(20, 4000, (1, chunk), key=mx.random.key(seed + chunk))
            rows.append(_row(model, cache, tokens, repeats, {"context": context, "chunk": chunk}))
            print(f"  {_line(rows[-1])}", flush=True)
    # A decode step of a left-padded batch (the generation batch's shape).
    batch = [max(contexts), max(contexts) * 3 // 4, max(contexts) // 2]
    cache = _filled(model, batch, seed)
    tokens = mx.random.randint(20, 4000, (len(batch), 1), key=mx.random.key(seed))
    rows.append(_row(model, cache, tokens, repeats, {"context": batch, "chunk": 1}))
    print(f"  {_line(rows[-1])}", flush=True)
    return rows


def _line(r: dict) -> str:
    ctx = r["context"]
    where = f"batch {'/'.join(map(str, ctx))}" if isinstance(ctx, list) else f"ctx {ctx:>6}"
    return (
        f"{where:>22}  L {r['chunk']:>3}  stock {r['stock_ms']:8.2f} ms  host "
        f"{r['host_ms']:8.2f} ms  x{r['speedup']:.2f}  max logit diff {r['max_logit_diff']:.1e}"
        f"{'' if r['same_argmax'] else '  ARGMAX DIFFERS'}"
    )


def report(rows: list) -> list[str]:
    """The report's lines for the dense rows."""
    return ["dense attention, one forward of the tiny qwen3_next (stock MLX vs host BLAS):"] + [
        "  " + _line(r) for r in rows
    ]
