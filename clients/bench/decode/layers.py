"""The layers `bench decode` measures, each a function that decodes K streams of N tokens.

- `loop_layer`: the model loop alone, in process (a LocalEngine's Generator
  stepped on this thread): the engine's own decode, no transport;
- `generate_layer`: `mlx_lm.generate` on the same model in a process of its own
  (one stream; its generation tokens/s is the forward's cost, our limit here);
- `client_layer`: a streaming client process (clients.bench.decode.stream_client)
  against a server: our gRPC front end, our HTTP bridge, or `mlx_lm.server`.
  The CPU that every process of the server side spends meanwhile is read
  from /proc (psutil), named by what the process is.

Each returns a `LayerRun`: per-stream token counts and times, from which
`decode.py` makes the figures. Knows the engine's in-process classes, the
client script and processes; nothing about tables or plots.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

from clients.bench.decode.stream_client import prompt_text


@dataclass
class StreamFigures:
    tokens: int
    first: float  # perf_counter seconds (in the process that measured)
    last: float
    sent: float = 0.0
    error: str = ""

    @property
    def tps(self) -> float:
        """Tokens per second after the first token."""
        span = self.last - self.first
        return (self.tokens - 1) / span if self.tokens > 1 and span > 0 else 0.0


@dataclass
class LayerRun:
    """One layer at K streams of N tokens."""

    layer: str
    streams: list[StreamFigures]
    cpu_s: dict = field(default_factory=dict)  # process kind -> CPU seconds during the run
    wall_s: float = 0.0
    steps: dict = field(default_factory=dict)  # the model loop's step profile summary
    generation_tps: float = 0.0  # mlx_lm.generate's own figure

    @property
    def per_stream_tps(self) -> float:
        if self.generation_tps:  # mlx_lm.generate's own figure (one stream)
            return self.generation_tps
        values = [s.tps for s in self.streams if s.tps > 0]
        return sum(values) / len(values) if values else 0.0

    @property
    def aggregate_tps(self) -> float:
        """Every stream's tokens over the span from the requests' sending to the last token of
        all (what the burst of requests got from the server, prefill included)."""
        if self.generation_tps:
            return self.generation_tps
        ok = [s for s in self.streams if s.tokens > 0]
        if not ok:
            return 0.0
        span = max(s.last for s in ok) - min(s.sent for s in ok)
        return sum(s.tokens for s in ok) / span if span > 0 else 0.0


# --------------------------------------------------------------- the loop ----


def loop_layer(engine, prompts: list[int], tokens: int) -> LayerRun:
    """One request per prompt on a LocalEngine's Generator, stepped here until all end."""
    import numpy as np

    from engine.cache.messages import PlanRequest
    from engine.runtime.events import Tokens
    from engine.runtime.requests import GenerationRequest, SamplingParams

    g = engine.generator
    streams = len(prompts)
    times: list[list[float]] = [[] for _ in range(streams)]
    counts = [0] * streams
    since = time.perf_counter()
    for i, prompt in enumerate(prompts):
        ids = engine.tokenizer.encode(prompt_text(prompt), add_special_tokens=False)
        rid = f"decode-{time.monotonic_ns()}-{i}"
        plan = engine.manager.plan(PlanRequest(rid, np.asarray(ids, dtype=np.int32), 0, rid))

        def emit(event, i=i) -> None:
            if isinstance(event, Tokens) and event.ids:
                times[i].append(time.perf_counter())
                counts[i] += len(event.ids)

        sampling = SamplingParams(max_tokens=tokens)
        g.submit(GenerationRequest(rid, rid, tuple(ids), plan, sampling, time.time()), emit)
    while g.busy or g.pending:
        g.step()
    wall = time.perf_counter() - since
    figures = [StreamFigures(counts[i], times[i][0], times[i][-1], since) for i in range(streams)]
    steps = g.profile.summary(since)
    if steps.get("steps"):
        steps["bare_ms"] = bare_step_ms(engine, streams)
    return LayerRun("loop", figures, wall_s=wall, steps=steps)


def bare_step_ms(engine, rows: int, context: int = 128, repeats: int = 24) -> dict:
    """A decode step's parts without the engine around them, on `rows` rows of `context`
    tokens: the model's forward of one token each, then the sampling (log-softmax and
    argmax over the vocabulary), each evaluated alone (median ms)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from clients.bench.figures import median_ms
    from engine.runtime.batching.batch import merge_with_room

    model = engine.model
    caches = []
    for r in range(rows):
        cache = make_prompt_cache(model)
        model(mx.array([[(r * 7 + i) % 1000 + 3 for i in range(context)]]), cache=cache)
        caches.append(cache)
    batch = merge_with_room(caches, room=repeats + 8)
    token = mx.array([[5]] * rows)
    mx.eval([c.state for c in batch])
    logits = model(token, cache=batch)
    mx.eval(logits)

    def forward():
        mx.eval(model(token, cache=batch))

    def sample():
        last = logits[:, -1, :]
        mx.eval(mx.argmax(last - mx.logsumexp(last, axis=-1, keepdims=True), axis=-1))

    return {
        "forward": round(median_ms(forward, repeats), 3),
        "sample": round(median_ms(sample, repeats), 3),
    }


# ---------------------------------------------------------- mlx_lm.generate ----


def generate_layer(model_dir: str, prompt: int, tokens: int) -> LayerRun:
    """`mlx_lm generate` on one stream's prompt, in a process of its own."""
    argv = [sys.executable, "-m", "mlx_lm", "generate", "--model", model_dir]
    argv += ["--prompt", prompt_text(prompt), "--max-tokens", str(tokens)]
    argv += ["--ignore-chat-template"]
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    found = re.search(r"Generation: (\d+) tokens, ([\d.]+) tokens-per-sec", out)
    if found is None:
        raise RuntimeError(f"mlx_lm generate printed no generation figure:\n{out[-500:]}")
    run = LayerRun("mlx_lm.generate", [], wall_s=wall, generation_tps=float(found.group(2)))
    run.streams = [StreamFigures(int(found.group(1)), 0.0, 0.0)]
    return run


# ------------------------------------------------------------- the servers ----


def client_layer(
    layer: str,
    protocol: str,
    address: str,
    prompts: list[int],
    tokens: int,
    watch=None,
    model: str = "",
    chat: bool = False,
) -> LayerRun:
    """A stream per prompt from a client process against `address`; `watch` (a
    ProcessWatch) reads the CPU of the server's processes over the run. HTTP: `model` is
    the body's model name, `chat` sends chat completions (stream_client)."""
    argv = [sys.executable, "-m", "clients.bench.decode.stream_client", protocol, address]
    argv += ["--prompts", ",".join(map(str, prompts)), "--tokens", str(tokens)]
    argv += (["--model", model] if model else []) + (["--chat"] if chat else [])
    before = watch.sample() if watch else {}
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ))
    wall = time.perf_counter() - t0
    cpu = watch.since(before) if watch else {}
    if done.returncode != 0:
        raise RuntimeError(f"the streaming client failed:\n{done.stderr[-2000:]}")
    rows = json.loads(done.stdout)
    figures = [
        StreamFigures(r["tokens"], r["first"], r["last"], r["sent"], r["error"]) for r in rows
    ]
    errors = [f.error for f in figures if f.error]
    if errors:
        raise RuntimeError(f"{layer}: {len(errors)} streams failed, first: {errors[0]}")
    return LayerRun(layer, figures, cpu_s=cpu, wall_s=wall)


class ProcessWatch:
    """CPU seconds of this process and its descendants (Ray's daemons and workers, a peer
    server), summed by what each process is."""

    def __init__(self, extra_pids: tuple[int, ...] = ()):
        self.extra = extra_pids

    def sample(self) -> dict[int, tuple[str, float]]:
        import psutil

        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        procs += [psutil.Process(p) for p in self.extra if psutil.pid_exists(p)]
        out = {}
        for p in procs:
            try:
                t = p.cpu_times()
                out[p.pid] = (process_kind(p, me.pid), t.user + t.system)
            except psutil.Error:  # ended meanwhile
                continue
        return out

    def since(self, before: dict[int, tuple[str, float]]) -> dict[str, float]:
        after = self.sample()
        kinds: dict[str, float] = {}
        for pid, (kind, cpu) in after.items():
            used = cpu - before.get(pid, (kind, 0.0))[1]
            if used > 0.0005:
                kinds[kind] = round(kinds.get(kind, 0.0) + used, 4)
        return kinds


def process_kind(p, me: int) -> str:
    """A process's part: the front end (this process), a Ray actor by class, a Ray daemon by
    name, the streaming client, mlx_lm.server."""
    if p.pid == me:
        return "front end (this process)"
    try:
        cmd = " ".join(p.cmdline())
        name = p.name()
    except Exception:
        return "other"
    if "stream_client" in cmd:
        return "client"
    if "mlx_lm.server" in cmd or "mlx_lm server" in cmd:
        return "mlx_lm.server"
    actor = re.search(r"ray::(\w+)", cmd) or re.search(r"ray::(\w+)", name)
    if actor:
        return f"ray::{actor.group(1)}"
    for daemon in (
        "gcs_server",
        "raylet",
        "dashboard_agent",
        "dashboard.py",
        "log_monitor",
        "monitor.py",
        "runtime_env",
        "default_worker",
    ):
        if daemon in cmd:
            return f"ray {daemon.removesuffix('.py')}"
    return name


def long_prompts(engine, count: int, tokens: int, candidates: int = 64) -> list[int]:
    """`count` prompt indexes whose greedy reply runs `tokens` tokens without meeting an end
    token (decoded here, 8 at a time), so every layer decodes the same long replies; the
    longest ones found when fewer do."""
    runs: list[tuple[int, int]] = []  # (tokens decoded, prompt)
    for start in range(0, candidates, 8):
        batch = list(range(start, start + 8))
        run = loop_layer(engine, batch, tokens)
        runs += [(s.tokens, p) for s, p in zip(run.streams, batch)]
        whole = [p for n, p in runs if n >= tokens]
        if len(whole) >= count:
            return whole[:count]
    return [p for _, p in sorted(runs, key=lambda r: (-r[0], r[1]))[:count]]
