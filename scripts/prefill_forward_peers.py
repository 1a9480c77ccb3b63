"""A prefill forward of n tokens at a context, and a bare greedy decode step, in three model
codes on the same weights: ours (mlx-lm's model with the engine's kernels), stock mlx-lm,
and mlx-vlm's.

    python scripts/prefill_forward_peers.py ours|lm MODEL_DIR      # the project's venv
    .cache/peers/mlx-vlm/bin/python scripts/prefill_forward_peers.py vlm PEER_VIEW_DIR

MODEL_DIR: the embedded tiny model (`clients.bench.harness.model_path(None)`);
PEER_VIEW_DIR: its view without mtp.safetensors (`clients.bench.peers.model_view`).
Prints the median ms of 3 per (context, n) and the decode step's ms.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

RNG = random.Random(1)


def ids(n: int):
    return mx.array([[RNG.randrange(20, 4000) for _ in range(n)]])


def load(which: str, path: str):
    """(make a cache, forward(tokens, cache) -> logits) for one model code."""
    if which == "vlm":
        from mlx_vlm.models.cache import make_prompt_cache
        from mlx_vlm.utils import load as vlm_load

        lm = vlm_load(path)[0].language_model
        return (lambda: make_prompt_cache(lm)), (lambda x, c: lm(x, cache=c).logits)
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    if which == "ours":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from clients.bench.concurrency.forward_costs import _engine_model

        model = _engine_model(path)
    else:
        model = mlx_lm.load(path)[0]
    return (lambda: make_prompt_cache(model)), (lambda x, c: model(x, cache=c))


def main() -> None:
    which, path = sys.argv[1], sys.argv[2]
    make, forward = load(which, path)

    def states(cache):
        out = []
        for c in cache:
            out += c.state if isinstance(c.state, (list, tuple)) else [c.state]
        return [a for a in out if a is not None]

    def run(cache, n: int) -> float:
        tic = time.perf_counter()
        mx.eval(forward(ids(n), cache), *states(cache))
        return (time.perf_counter() - tic) * 1000

    for context in (0, 4096):
        for n in (64, 256, 1024, 2048):
            times = []
            for _ in range(3):
                cache = make()
                for i in range(0, context, 2048):
                    run(cache, min(2048, context - i))
                times.append(run(cache, n))
            ms = statistics.median(times)
            print(
                f"{which} prefill context {context} n {n}: {ms:.1f} ms = {n / ms * 1000:.0f} tok/s"
            )
    cache = make()
    run(cache, 64)
    y = mx.array([[5]])
    tic = time.perf_counter()
    for _ in range(200):
        y = mx.argmax(forward(y, cache)[:, -1, :], axis=-1, keepdims=True)
        mx.eval(y)
    sync = (time.perf_counter() - tic) / 200 * 1000
    cache = make()
    run(cache, 64)
    nxt = mx.argmax(forward(mx.array([[5]]), cache)[:, -1, :], axis=-1, keepdims=True)
    mx.async_eval(nxt)
    tic = time.perf_counter()
    for _ in range(200):
        cur = nxt
        nxt = mx.argmax(forward(cur, cache)[:, -1, :], axis=-1, keepdims=True)
        mx.async_eval(nxt)
        cur.item()
    piped = (time.perf_counter() - tic) / 200 * 1000
    print(f"{which} decode step: sync {sync:.2f} ms, next step's async_eval first {piped:.2f} ms")


if __name__ == "__main__":
    main()
