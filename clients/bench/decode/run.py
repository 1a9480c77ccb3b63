"""The run of `bench decode`: the engines and peers it starts, the layers in turn, the figures.

Our engine starts as `lineage serve --http-port` starts it (Ray with the same
options, the model actor, the front end, the bridge beside it), `mlx_lm.server`
in a process of its own, and a LocalEngine in this process for the loop
alone. For each reply length and stream count every layer runs once, one
after the other, so each ratio compares runs minutes apart at most.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time

from clients.bench.decode.layers import (
    LayerRun,
    ProcessWatch,
    client_layer,
    generate_layer,
    long_prompts,
    loop_layer,
)
from clients.bench.harness import engine_config, model_path


def measure(args: argparse.Namespace) -> dict:
    config = engine_config(args)
    model_dir = model_path(config.model.path)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, path=model_dir))
    layers = args.layers
    runs: list[LayerRun] = []
    with contextlib.ExitStack() as stack:
        local = _local_engine(config)
        # Prompts whose greedy replies run the longest length asked: the same for every layer.
        prompts = long_prompts(local, max(args.streams), max(args.tokens))
        print(f"prompts {prompts}", flush=True)
        servers = stack.enter_context(_servers(config, layers))
        for n in args.tokens:
            for k in args.streams:
                for layer in layers:
                    run = _one(layer, prompts[:k], n, local, servers, model_dir)
                    if run is not None:
                        runs.append((k, n, run))
                        print(
                            f"  {layer:<16} {k} x {n}: {run.aggregate_tps:.0f} tok/s aggregate",
                            flush=True,
                        )
    return _figures(model_dir, prompts, runs)


@dataclasses.dataclass
class Servers:
    engine: object = None  # BackgroundEngine
    bridge_url: str = ""
    peer: object = None  # MlxLmServer
    watch: ProcessWatch | None = None


@contextlib.contextmanager
def _servers(config, layers):
    """Our engine (as `lineage serve` starts it, bridge included) and mlx_lm.server."""
    from clients.bench.peer import MlxLmServer

    s = Servers(watch=ProcessWatch())
    with contextlib.ExitStack() as stack:
        if {"grpc", "bridge"} & set(layers):
            stack.enter_context(_serve_ray(config))
            import tempfile

            from engine.server.background import BackgroundEngine

            private = stack.enter_context(tempfile.TemporaryDirectory(prefix="lineage-"))
            s.engine = BackgroundEngine(config, local_socket=f"{private}/grpc.sock")
            stack.callback(s.engine.stop)
            if "bridge" in layers:
                handle = s.engine.call(_start_bridge(config, s.engine))
                stack.callback(lambda: s.engine.call(handle.stop()))
                s.bridge_url = handle.url
        if "mlx_lm.server" in layers:
            s.peer = stack.enter_context(MlxLmServer(config.model.path))
            s.watch = ProcessWatch(extra_pids=(s.peer.process.pid,))
        yield s


@contextlib.contextmanager
def _serve_ray(config):
    """Ray started with the options `lineage serve` starts it with (dashboard included)."""
    import ray

    from engine.server.serve import ray_options

    ray.init(**ray_options(config))
    try:
        yield
    finally:
        ray.shutdown()


async def _start_bridge(config, engine):
    """The bridge beside the engine, as `lineage serve --http-port` starts it (port 0)."""
    from clients.cli.serve import bridge_sidecar

    server = dataclasses.replace(config.server, host="127.0.0.1", http_port=0)
    start = bridge_sidecar(dataclasses.replace(config, server=server), quiet=True)
    return await start(engine.engine)


def _local_engine(config):
    from engine.runtime.local import LocalEngine

    return LocalEngine(config)


def _one(layer: str, prompts: list[int], n: int, local, servers: Servers, model_dir: str):
    if layer == "loop":
        return loop_layer(local, prompts, n)
    if layer == "mlx_lm.generate":
        return generate_layer(model_dir, prompts[0], n) if len(prompts) == 1 else None
    if layer == "mlx_lm.server":
        url = f"http://127.0.0.1:{servers.peer.port}"
        return client_layer(layer, "http", url, prompts, n, servers.watch)
    since = time.perf_counter()
    if layer == "grpc":
        run = client_layer(layer, "grpc", servers.engine.address, prompts, n, servers.watch)
    else:
        run = client_layer(layer, "http", servers.bridge_url, prompts, n, servers.watch)
    run.steps = servers.engine.step_profile(since)
    return run


def _figures(model_dir: str, prompts: list[int], runs: list) -> dict:
    rows = []
    for k, n, run in runs:
        tokens = sum(s.tokens for s in run.streams)
        rows.append(
            {
                "layer": run.layer,
                "streams": k,
                "tokens": n,
                "tokens_received": [s.tokens for s in run.streams],
                "per_stream_tps": round(run.per_stream_tps, 1),
                "aggregate_tps": round(run.aggregate_tps, 1),
                "wall_s": round(run.wall_s, 3),
                "cpu_s": run.cpu_s,
                "cpu_ms_per_token": {
                    kind: round(cpu * 1000 / max(1, tokens), 4)
                    for kind, cpu in sorted(run.cpu_s.items(), key=lambda kv: -kv[1])
                    if kind != "client"
                },
                "steps": run.steps,
            }
        )
    by = {(r["layer"], r["streams"], r["tokens"]): r for r in rows}
    for r in rows:
        server = by.get(("mlx_lm.server", r["streams"], r["tokens"]))
        if server and server["aggregate_tps"]:
            r["vs_server"] = round(r["aggregate_tps"] / server["aggregate_tps"], 3)
        generate = by.get(("mlx_lm.generate", 1, r["tokens"]))
        if generate and generate["per_stream_tps"]:
            r["vs_generate"] = round(r["per_stream_tps"] / generate["per_stream_tps"], 3)
    return {
        "model": model_dir,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "prompts": prompts,
        "runs": rows,
    }
