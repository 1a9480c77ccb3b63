"""A pipelined greedy decode step on the embedded tiny model, `--cpu-fusion` off and on.

    python scripts/cpu_fusion_ab.py [ROWS ...]      # default 1 4 8

For each batch of ROWS rows (a 64-token context each, merged into one batch
cache as the generation batch has it): mlx-lm's decode step shape (the
forward, the log-softmax, the argmax, the next step's `async_eval` before the
current tokens are read), 100 steps at a time, with engine/kernels/cpu_fusion
uninstalled and installed in turn, five times each in one process. Prints
the median ms per step with the spread, and the primitives one forward's
graph holds each way.
"""

from __future__ import annotations

import io
import re
import statistics
import sys
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from engine.kernels import cpu_fusion, gated_delta
from engine.runtime.batching.batch import merge_with_room
from engine.runtime.model.tiny_models import ensure_default_model


def batch_cache(model, rows: int) -> list:
    caches = []
    for r in range(rows):
        cache = make_prompt_cache(model)
        model(mx.array([[(r * 7 + i) % 1000 + 3 for i in range(64)]]), cache=cache)
        caches.append(cache)
    batch = merge_with_room(caches, room=3000)
    mx.eval([c.state for c in batch])
    return batch


def step_ms(model, batch, rows: int, steps: int = 100) -> float:
    y = mx.array([5] * rows)
    mx.eval(y)
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = model(y[:, None], cache=batch)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        following = mx.argmax(logprobs, axis=-1)
        mx.async_eval(following, logprobs)
        y.tolist()
        y = following
    mx.eval(y)
    return (time.perf_counter() - t0) / steps * 1000


def primitives(model, batch, rows: int) -> int:
    dot = io.StringIO()
    mx.export_to_dot(dot, model(mx.array([[5]] * rows), cache=batch))
    return len(re.findall(r'label ="?[A-Za-z_]', dot.getvalue()))


def main() -> None:
    model, _ = load(str(ensure_default_model()))
    gated_delta.install(model, "auto")
    fused = {False: cpu_fusion.uninstall, True: cpu_fusion.install}
    for rows in [int(a) for a in sys.argv[1:]] or [1, 4, 8]:
        batch = batch_cache(model, rows)
        ms: dict = {False: [], True: []}
        counts = {}
        for on in (False, True):  # warm: the compiled functions trace here
            fused[on](model)
            step_ms(model, batch, rows, 20)
            counts[on] = primitives(model, batch, rows)
        for _ in range(5):
            for on in (False, True):
                fused[on](model)
                ms[on].append(step_ms(model, batch, rows))
        off, on = (statistics.median(ms[k]) for k in (False, True))
        print(
            f"rows {rows}: off {off:.2f} ms ({min(ms[False]):.2f}-{max(ms[False]):.2f}, "
            f"{counts[False]} primitives), on {on:.2f} ms ({min(ms[True]):.2f}-"
            f"{max(ms[True]):.2f}, {counts[True]}), on/off {on / off:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
