"""`lineage serve`: the engine (Ray, model actors, gRPC server), and the bridge beside it.

Builds the EngineConfig from the flags given and the environment, refuses an
exposed bind without a token, then hands it to `engine.server.serve.run`: MLX
and Ray load there, and only there. With `--http-port` it starts the OpenAI
bridge (clients.bridge) once the engine serves.
"""

from __future__ import annotations

import argparse

from clients.cli.args import UsageError, add_serve_arguments, config_from_args
from engine.config import EngineConfig

HELP = "run the engine (Ray, model actors, gRPC server)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_serve_arguments(p)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args, args.env)
        config.server.check_exposure()
    except (ValueError, OSError) as error:
        raise UsageError(str(error))
    from engine.server import serve  # MLX and Ray load here, and only here

    sidecars = [bridge_sidecar(config)] if config.server.http_port else []
    return int(serve.run(config, sidecars) or 0)


def bridge_sidecar(config: EngineConfig, quiet: bool = False):
    """Start the OpenAI bridge in front of the engine once it serves (`--http-port`): in the
    engine's process, calling its front end directly (no gRPC loopback)."""
    from clients.bridge.in_process import InProcessBackend
    from clients.bridge.server import bridge_options, bridge_security, start_bridge

    host, port = config.server.host, config.server.http_port
    security = bridge_security(config.server, config.limits)
    options = bridge_options(config)

    async def start(engine):
        backend = InProcessBackend(engine)
        handle = await start_bridge(backend, host, port, security, options)
        if not quiet:
            print(f"lineage: OpenAI-compatible bridge on {handle.url}/v1", flush=True)
        return handle

    return start
