"""The agent traffic against our engine: one fresh engine per cache mode, through `Client`.

`run_engine` starts a BackgroundEngine in one cache mode (on one or several model
replicas, with a cache directory of its own, `engine_config`) and drives the
traffic through it one thread per lane (clients.bench.agents.drive), cancelling a
dropped stream after its drop point; each reply's prompt must be the one rendered
here (clients.bench.agents.prompt_ids). It knows the engine's config and client;
nothing of the other policies or of the report. Ray must be initialized;
the engine is imported when a run starts.
"""

from __future__ import annotations

import os
import time

from clients.bench.agents.drive import drive
from clients.bench.agents.observed import Observed, PolicyRun
from clients.bench.agents.options import BenchOptions
from clients.bench.agents.prompt_ids import PromptIds
from clients.bench.agents.traffic import Traffic


def _send(client, spec, messages, tools, seed):
    """One request through the client; cancels after `drop_after` chunks.
    (ids, text, final, client's time to first token in ms)."""
    from clients.client import Chunk, Final

    ids, texts, chunks, final = [], [], 0, None
    t_send, t_first = time.perf_counter(), None
    stream = client.stream(
        messages=messages,
        tools=list(tools),
        max_tokens=spec.max_tokens,
        namespace=spec.namespace,
        temperature=0.0,
        seed=seed,
    )
    for event in stream:
        if isinstance(event, Chunk):
            if event.ids and t_first is None:
                t_first = time.perf_counter()
            ids += event.ids
            texts.append(event.text)
            chunks += 1
            if spec.drop_after and chunks >= spec.drop_after:
                stream.cancel()
                break
        elif isinstance(event, Final):
            final = event
    ttft_ms = ((t_first or time.perf_counter()) - t_send) * 1000
    return ids, "".join(texts), final, ttft_ms


def run_engine(
    mode: str,
    traffic: Traffic,
    opts: BenchOptions,
    ids: PromptIds,
    cache_dir: str,
    replicas: int = 1,
) -> PolicyRun:
    """The traffic against a fresh engine in cache mode `mode` on `replicas` model replicas
    (Ray must be initialized)."""
    from concurrent.futures import ThreadPoolExecutor

    from clients.client import Client
    from engine.server.running.background import BackgroundEngine

    config = engine_config(mode, opts, cache_dir, replicas)
    files = _FilesSeen(cache_dir)
    with (
        BackgroundEngine(config, timeout=600) as engine,
        Client(engine.address, timeout=600) as client,
        ThreadPoolExecutor(max(1, traffic.agents)) as pool,
    ):

        def serve(batch):
            futures = [
                pool.submit(_send, client, spec, messages, traffic.tools, opts.seed)
                for spec, messages, _ in batch
            ]
            for (spec, _, prompt), future in zip(batch, futures):
                got, text, final, ttft_ms = future.result()
                yield _served(mode, spec, prompt, got, final, ttft_ms), text

        def sample():
            s = client.cache_stats()
            return {
                "ram_bytes": s["ram_bytes"],
                "disk_bytes": s["disk_bytes"],
                "evictions": s["evictions"],
                "disk_bytes_written": s.get("disk_bytes_written", files.written()),
            }

        run = drive(mode, traffic, ids, serve, sample)
        if replicas > 1:
            from clients.bench.agents.replicas import replica_figures

            run.name = f"{mode}_x{replicas}"
            run.replicas = replica_figures(engine, client, run.observed)
        return run


def engine_config(mode: str, opts: BenchOptions, cache_dir: str, replicas: int):
    from clients.bench.harness import bench_kernels
    from engine.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig

    interval = {} if opts.message_interval is None else {"message_interval": opts.message_interval}
    return EngineConfig(
        model=ModelConfig(path=opts.model, prefill_step_size=opts.prefill_step_size),
        cache=CacheConfig(mode=mode, ram_budget=opts.ram_budget, cache_dir=cache_dir, **interval),
        kernels=bench_kernels(),
        server=ServerConfig(
            port=0,
            replicas=replicas,
            route_threshold=opts.route_threshold,
            ray_namespace=f"lineage-bench-{mode}-{replicas}",
        ),
    )


def _served(mode: str, spec, prompt, got: list, final, ttft_ms: float) -> Observed:
    """One request as our engine served it; its prompt must be the one rendered here."""
    done = final is not None and final.finish_reason != "cancelled"
    ob = Observed(spec.rid, spec.step, spec.lane, spec.kind, prompt, got, done)
    if final is not None and final.usage.prompt_tokens != len(prompt):
        raise RuntimeError(
            f"{mode}: request {spec.rid} has {final.usage.prompt_tokens} prompt "
            f"tokens on the server, {len(prompt)} rendered here"
        )
    if done:
        ob.cached, ob.ttft_ms = final.usage.cached_tokens, ttft_ms  # the client's
        ob.restore, ob.restore_length = final.restore.kind, final.restore.length
    return ob


class _FilesSeen:
    """Bytes written to a cache directory, as far as the files seen between steps tell.

    Entry files are written once under a name of their own (a temporary name,
    then a rename); every name seen counts once, at its largest size. A file
    written and deleted between two looks is missed.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.sizes: dict[str, int] = {}

    def written(self) -> int:
        for root, _, names in os.walk(self.directory):
            for name in names:
                if name.startswith("."):  # a temporary name
                    continue
                path = os.path.join(root, name)
                try:
                    size = os.path.getsize(path)
                except OSError:  # deleted meanwhile
                    continue
                self.sizes[path] = max(size, self.sizes.get(path, 0))
        return sum(self.sizes.values())
