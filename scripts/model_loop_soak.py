"""A long stream of varied requests through the model loop in one process, reporting what
its memory does: for finding what grows in the model actor over a soak, without Ray.

The model loop (engine.runtime.loop) over a random-weight qwen3_next (the tests' tiny
model), the cache manager in process (LocalLink), a RAM tier of `--ram` bytes and MLX's
buffer pool capped at 2 MiB as in the soak: waves of 1-4 concurrent requests of many
prompt lengths, sessions growing turn by turn and compacted, cancels, and (`--tools`) a
lazy tool grammar on every request, its tool set new every 15 waves (the soak's sub-agent
rounds each bring their own). Every `--every` waves it prints the process's anonymous RSS
before and after `malloc_trim` (what glibc held free), MLX's active and cached bytes, the
fill of the generator's bounded rings and grammar cache, and the distinct input shapes
that reached each `mx.compile`d function without `shapeless` (each a graph kept for good).
At the end: the containers reachable from the generator that grew after warm-up.

    MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=131072 nice -n 19 \\
        python scripts/model_loop_soak.py --waves 2400 --tools

It knows the runtime's classes and their attribute names; it judges nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import random
import tempfile
import time
from collections import defaultdict

import mlx.core as mx
import numpy as np

from engine.kernels import cpu_fusion
from engine.runtime import packed_state
from engine.runtime.malloc import glibc, trim
from engine.runtime.structured import masked_batch

SHAPES: dict = defaultdict(set)


def count_shapes(module, name: str) -> None:
    """Wrap `module.name` (a compiled function) to note each distinct input signature."""
    fn = getattr(module, name)

    def counted(*args, **kwargs):
        SHAPES[name].add(
            tuple((x.shape, str(x.dtype)) if isinstance(x, mx.array) else repr(x) for x in args)
        )
        return fn(*args, **kwargs)

    setattr(module, name, counted)


def anon_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) / 1024
    return 0.0


def sizes(obj, path: str, out: dict, depth: int, seen: set) -> None:
    """Lengths of the containers reachable from `obj` (engine objects' attributes)."""
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, (dict, list, set, tuple)) or type(obj).__name__ == "deque":
        out[path] = len(obj)
    if isinstance(obj, dict):
        for k, v in list(obj.items())[:50]:
            sizes(v, f"{path}[{k!r}]"[:120], out, depth + 1, seen)
    elif isinstance(obj, (list, tuple)) and len(obj) < 50:
        for i, v in enumerate(obj):
            sizes(v, f"{path}[{i}]", out, depth + 1, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        if type(obj).__module__.startswith(("engine", "mlx_lm")):
            for k, v in vars(obj).items():
                sizes(v, f"{path}.{k}", out, depth + 1, seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waves", type=int, default=1200)
    parser.add_argument("--every", type=int, default=150)
    parser.add_argument("--ram", type=int, default=8 << 20)
    parser.add_argument("--tools", action="store_true", help="a tool grammar on every request")
    args = parser.parse_args()

    count_shapes(cpu_fusion, "_rope")
    count_shapes(packed_state, "_scaled")
    count_shapes(masked_batch, "_held")

    from clients.bench.agents.agent_text import make_tools
    from engine.cache.manager import CacheManager
    from engine.cache.messages import PlanRequest
    from engine.config import CacheConfig, EngineConfig, ModelConfig
    from engine.runtime.events import Finished
    from engine.runtime.generator import Generator
    from engine.runtime.local import LocalLink
    from engine.runtime.loop import ModelLoop
    from engine.runtime.model.loader import load_model
    from engine.runtime.model.tiny_models import write_model_dir
    from engine.runtime.requests import GenerationRequest, SamplingParams
    from engine.runtime.structured.tools import tool_grammar
    from engine.runtime.tier.ram import RamTier

    tmp = tempfile.mkdtemp(prefix="model-loop-soak-")
    model_dir = write_model_dir("qwen3_next", os.path.join(tmp, "model"))
    config = EngineConfig(
        model=ModelConfig(path=str(model_dir), prefill_step_size=128),
        cache=CacheConfig(cache_dir=os.path.join(tmp, "cache"), ram_budget=args.ram),
    )
    model, tokenizer, info = load_model(config)
    mx.set_cache_limit(2 << 20)
    manager = CacheManager(config.cache, info.fingerprint, info.has_state_layers)

    def build() -> Generator:
        tier = RamTier(info.has_state_layers)
        return Generator(model, tokenizer, config, tier, LocalLink(manager))

    loop = ModelLoop(build, idle_release_s=5)
    rng = random.Random(7)
    ids = iter(range(1 << 30))
    grammars: dict = {}
    sessions: list[list[int]] = []
    libc = glibc()  # None where malloc is not glibc's

    def tools(round_: int):
        if round_ not in grammars:
            grammars.clear()
            made = make_tools(400, 5000 + round_)
            grammars[round_] = tool_grammar(made, "auto", "", output_format="qwen", where="t")
        return grammars[round_]

    def submit(tokens, max_tokens, grammar):
        rid = f"r{next(ids)}"
        # planned on the loop thread: the manager is not thread-safe
        plan = loop.ask(lambda g: manager.plan(PlanRequest(rid, np.asarray(tokens, np.int32))))
        temperature = 1.0 if grammar is not None else 0.0
        sampling = SamplingParams(max_tokens, temperature, seed=rng.randrange(1000))
        req = GenerationRequest(
            rid, "", tuple(tokens), plan, sampling, time.time(), grammar=grammar
        )
        events: queue.SimpleQueue = queue.SimpleQueue()
        loop.call(lambda g: g.submit(req, events.put))
        return rid, events

    def wave(n: int) -> None:
        live = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.4 and sessions:
                s = rng.choice(sessions)
                s += [rng.randrange(20, 3000) for _ in range(rng.randint(5, 60))]
                if len(s) > 1200:
                    del s[40:]  # compacted: the system prompt and a summary again
                tokens = list(s)
            else:
                tokens = [rng.randrange(20, 3000) for _ in range(rng.randint(10, 300))]
                sessions.append(list(tokens))
                del sessions[:-30]
            grammar = tools(n // 15) if args.tools else None
            live.append(submit(tokens, rng.randint(1, 24), grammar))
        if rng.random() < 0.15:
            rid = live[-1][0]
            time.sleep(0.02)
            loop.call(lambda g: g.cancel(rid))
        for _, events in live:
            while not isinstance(events.get(timeout=300), Finished):
                pass

    def report(tag: str) -> None:
        gc.collect()
        before = anon_mib()
        trim(libc)  # nothing where malloc is not glibc's
        g = loop.generator
        row = {
            "tag": tag,
            "anon_mib": round(before, 1),
            "anon_trimmed_mib": round(anon_mib(), 1),
            "mx_active": mx.get_active_memory(),
            "mx_cache": mx.get_cache_memory(),
            "steps": len(g.profile.steps),
            "prefill_rows": len(g.prefill_log.rows),
            "prefill_chunks": len(g.prefill_log.chunks),
            "grammars": len(g.grammars.pristine),
            "compiled_shapes": {k: len(v) for k, v in SHAPES.items()},
        }
        print(json.dumps(row), flush=True)

    def snapshot() -> dict:
        out: dict = {}
        sizes(loop.generator, "g", out, 0, set())
        return out

    warm = args.waves // 4
    for n in range(warm):
        wave(n)
    report("warm")
    first = snapshot()
    for n in range(warm, warm + args.waves):
        wave(n)
        if (n - warm) % args.every == args.every - 1:
            report(f"wave {n - warm + 1}")
    grew = {k: (first.get(k), v) for k, v in snapshot().items() if v > (first.get(k) or 0) + 5}
    print(json.dumps({"grew_after_warm_up": grew}))
    loop.stop()


if __name__ == "__main__":
    main()
