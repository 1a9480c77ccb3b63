"""What one forward costs on this backend, in process: the ground for two prefill settings.

`lineage bench concurrency` reports these beside its runs. `grouping_probe`:
prefill cost per token of equal chunks of several sequences in one unpadded
batch against the same chunks one sequence at a time (the ground for
`--prefill-group`). `floor_probe`: one forward of n prompt tokens at several
contexts against a decode step (the floor of a chunk beside decode). The
model is loaded as the engine runs it, with its default kernels; no engine,
no Ray. MLX and mlx-lm load inside the functions.
"""

from __future__ import annotations

import random
import time

from clients.bench.figures import median


def _engine_model(model_dir: str):
    """The model as the engine runs it: mlx-lm's, with the run's kernel set installed."""
    import mlx_lm

    from clients.bench.harness import bench_kernels
    from engine.config import EngineConfig
    from engine.runtime.model.loader import install_kernels

    model, _ = mlx_lm.load(model_dir)
    install_kernels(model, EngineConfig(kernels=bench_kernels()))
    return model


def grouping_probe(model_dir: str, chunk: int = 128, group: int = 3) -> dict:
    """Prefill cost per token on this backend: `group` equal chunks in one batch, or one by one.

    The measured ground for `--prefill-group`: at an empty context and after
    4k tokens of context, `group` sequences' chunks of `chunk` tokens as one
    unpadded batch, against the same chunks one sequence at a time.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.runtime.batching.batch import merge_with_room

    model = _engine_model(model_dir)
    rng = random.Random(0)

    def run(batch: int, context: int) -> float:
        caches = [make_prompt_cache(model) for _ in range(batch)]
        cache = merge_with_room(caches, room=0) if batch > 1 else caches[0]
        ids = [[rng.randrange(20, 4000) for _ in range(context + 4 * chunk)] for _ in range(batch)]
        tokens = mx.array(ids)
        if context:
            for i in range(0, context, 512):
                model(tokens[:, i : min(context, i + 512)], cache=cache)
                mx.eval([c.state for c in cache])
        tic = time.perf_counter()
        for i in range(context, context + 4 * chunk, chunk):
            model(tokens[:, i : i + chunk], cache=cache)
            mx.eval([c.state for c in cache])
        return (time.perf_counter() - tic) * 1000 / (batch * 4 * chunk)

    run(1, 0)  # warm up
    out = {"chunk": chunk, "group": group}
    for context in (0, 4096):
        one = sum(run(1, context) for _ in range(group)) / group
        grouped = run(group, context)
        out[f"ms_per_token_one_at_{context}"] = one
        out[f"ms_per_token_grouped_at_{context}"] = grouped
    return out


def floor_probe(model_dir: str, contexts=(0, 2048, 4096, 8192), sizes=(1, 2, 4, 8, 16)) -> dict:
    """The floor of a chunk beside decode: one forward of n prompt tokens at each context,
    against a decode step (one token at an empty context), median ms of a few."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model = _engine_model(model_dir)
    rng = random.Random(1)

    def ids(n):
        return mx.array([[rng.randrange(20, 4000) for _ in range(n)]])

    def forward_ms(cache, n: int) -> float:
        times = []
        for _ in range(5):
            tic = time.perf_counter()
            model(ids(n), cache=cache)
            mx.eval([c.state for c in cache])
            times.append((time.perf_counter() - tic) * 1000)
        return median(times)

    out = {}
    for context in contexts:
        cache = make_prompt_cache(model)
        for i in range(0, context, 512):
            model(ids(min(512, context - i)), cache=cache)
            mx.eval([c.state for c in cache])
        out[context] = {n: forward_ms(cache, n) for n in sizes}
    return {"forward_ms": out, "decode_ms": out[contexts[0]][1]}
