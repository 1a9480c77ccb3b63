"""The run of `bench decode`: the engines and peers it starts, the layers in turn, the figures.

Our engine starts as `lineage serve --http-port` starts it (Ray with the same
options, the model actor, the front end, the bridge beside it), each peer
server in a process of its own (clients.bench.peers), and a LocalEngine in
this process for the loop alone. For each reply length and stream count every
layer runs once, one after the other, `rounds` times (interleaved), so each
ratio compares runs minutes apart at most; a figure is the median of its
rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
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

PEERS = ("mlx_lm.server", "mlx_vlm.server", "rapid_mlx")
CHAT_ONLY = ("mlx_vlm.server",)  # no raw /v1/completions: the prompt as a chat message


def measure(args: argparse.Namespace) -> dict:
    config = engine_config(args)
    model_dir = model_path(config.model.path)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, path=model_dir))
    layers = args.layers
    runs: list[LayerRun] = []
    load = [os.getloadavg()]
    if getattr(args, "install_peers", False):
        from clients.bench.peers import install

        for name in set(layers) & set(PEERS):
            install(name)
    with contextlib.ExitStack() as stack:
        local = _local_engine(config)
        # Its prefill worker drops its MLX state (compiled functions) before the process
        # exits: left to the thread's exit handlers, the interpreter may be finalizing.
        stack.callback(local.generator.close)
        # Prompts whose greedy replies run the longest length asked: the same for every layer.
        prompts = long_prompts(local, max(args.streams), max(args.tokens))
        print(f"prompts {prompts}", flush=True)
        servers = stack.enter_context(_servers(config, layers))
        for n in args.tokens:
            for k in args.streams:
                for _ in range(max(1, getattr(args, "rounds", 1))):
                    for layer in layers:
                        if layer in servers.skipped:
                            continue
                        run = _one(layer, prompts[:k], n, local, servers, model_dir)
                        if run is not None:
                            runs.append((k, n, run))
                            print(
                                f"  {layer:<16} {k} x {n}: {run.aggregate_tps:.0f} tok/s aggregate",
                                flush=True,
                            )
    load.append(os.getloadavg())
    figures = _figures(model_dir, prompts, runs)
    return figures | {"skipped": servers.skipped, "load_average": load}


@dataclasses.dataclass
class Servers:
    engine: object = None  # BackgroundEngine
    bridge_url: str = ""
    peers: dict = dataclasses.field(default_factory=dict)  # layer -> PeerServer
    skipped: dict = dataclasses.field(default_factory=dict)  # layer -> why it cannot run
    watch: ProcessWatch | None = None


@contextlib.contextmanager
def _servers(config, layers):
    """Our engine (as `lineage serve` starts it, bridge included) and the peers asked."""
    from clients.bench.peers import start_or_reason

    s = Servers(watch=ProcessWatch())
    with contextlib.ExitStack() as stack:
        if {"grpc", "bridge"} & set(layers):
            stack.enter_context(_serve_ray(config))
            import tempfile

            from engine.server.running.background import BackgroundEngine

            private = stack.enter_context(tempfile.TemporaryDirectory(prefix="lineage-"))
            s.engine = BackgroundEngine(config, local_socket=f"{private}/grpc.sock")
            stack.callback(s.engine.stop)
            if "bridge" in layers:
                handle = s.engine.call(_start_bridge(config, s.engine))
                stack.callback(lambda: s.engine.call(handle.stop()))
                s.bridge_url = handle.url
        for name in [n for n in layers if n in PEERS]:
            server, reason = start_or_reason(name, config.model.path)
            if server is None:
                print(f"  {name}: skipped: {reason}", flush=True)
                s.skipped[name] = reason
                continue
            s.peers[name] = stack.enter_context(server)
        s.watch = ProcessWatch(extra_pids=tuple(p.process.pid for p in s.peers.values()))
        yield s


@contextlib.contextmanager
def _serve_ray(config):
    """Ray started with the options `lineage serve` starts it with (dashboard included)."""
    import ray

    from engine.server.running.serve import ray_options

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
    if layer in PEERS:
        peer = servers.peers[layer]
        url = f"http://127.0.0.1:{peer.port}"
        model = peer.model or ""
        return client_layer(
            layer, "http", url, prompts, n, servers.watch, model, layer in CHAT_ONLY
        )
    since = time.perf_counter()
    if layer == "grpc":
        run = client_layer(layer, "grpc", servers.engine.address, prompts, n, servers.watch)
    else:
        run = client_layer(layer, "http", servers.bridge_url, prompts, n, servers.watch)
    run.steps = servers.engine.step_profile(since)
    return run


def _figures(model_dir: str, prompts: list[int], runs: list) -> dict:
    cells: dict = {}
    for k, n, run in runs:
        cells.setdefault((run.layer, k, n), []).append(run)
    rows = [_row(layer, k, n, rounds) for (layer, k, n), rounds in cells.items()]
    by = {(r["layer"], r["streams"], r["tokens"]): r for r in rows}
    for r in rows:
        server = by.get(("mlx_lm.server", r["streams"], r["tokens"]))
        if server and server["aggregate_tps"]:
            r["vs_server"] = round(r["aggregate_tps"] / server["aggregate_tps"], 3)
        others = [
            by[(p, r["streams"], r["tokens"])]["aggregate_tps"]
            for p in PEERS[1:]
            if (p, r["streams"], r["tokens"]) in by
        ]
        if others and max(others) > 0:  # the fastest of mlx-vlm's and Rapid-MLX's
            r["vs_peer"] = round(r["aggregate_tps"] / max(others), 3)
        generate = by.get(("mlx_lm.generate", 1, r["tokens"]))
        if generate and generate["per_stream_tps"]:
            r["vs_generate"] = round(r["per_stream_tps"] / generate["per_stream_tps"], 3)
    return {
        "model": model_dir,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "prompts": prompts,
        "runs": rows,
    }


def _row(layer: str, k: int, n: int, rounds: list) -> dict:
    """One cell's figures: medians of its rounds (the first round's CPU and steps)."""
    run = rounds[0]
    tokens = sum(s.tokens for s in run.streams)
    aggregate = [r.aggregate_tps for r in rounds]
    return {
        "layer": layer,
        "streams": k,
        "tokens": n,
        "rounds": len(rounds),
        "tokens_received": [s.tokens for s in run.streams],
        "per_stream_tps": round(statistics.median(r.per_stream_tps for r in rounds), 1),
        "aggregate_tps": round(statistics.median(aggregate), 1),
        "aggregate_rounds": [round(a, 1) for a in aggregate],
        "aggregate_spread": (round(min(aggregate), 1), round(max(aggregate), 1)),
        "wall_s": round(run.wall_s, 3),
        "cpu_s": run.cpu_s,
        "cpu_ms_per_token": {
            kind: round(cpu * 1000 / max(1, tokens), 4)
            for kind, cpu in sorted(run.cpu_s.items(), key=lambda kv: -kv[1])
            if kind != "client"
        },
        "steps": run.steps,
    }
