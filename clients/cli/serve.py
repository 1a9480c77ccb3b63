"""`lineage serve`: the engine (Ray, model actors, gRPC server), and the bridge beside it.

Builds the EngineConfig from the flags given and the environment, refuses an
exposed bind without a token, a port another process holds and a model
directory that holds no model (engine.server.running.preflight), each in one line with
exit status 2. A model given by its Hugging Face name (`org/name[@rev]`) is
taken from the cache or downloaded there first, before Ray (engine.hub; a
failure is one line, exit 2, or 1 for a download that broke). Then it hands
it to `engine.server.running.lifecycle.run`: MLX and Ray load there, and only there.
With `--http-port` it starts the OpenAI bridge (clients.bridge) once the engine
serves.
"""

from __future__ import annotations

import argparse

from clients.cli.args import CommandError, UsageError, add_serve_arguments, config_from_args
from engine.config import EngineConfig, ServerConfig
from engine.config.declare import label_of

HELP = "run the engine (Ray, model actors, gRPC server)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_serve_arguments(p)


def run(args: argparse.Namespace) -> int:
    from engine.hub import HubError, HubSettings
    from engine.server.running import preflight  # sockets, files, the Hub: no Ray, no MLX

    try:
        config = config_from_args(args, args.env)
        config.server.check_exposure()
        preflight.check_ports(config.server)  # before a download, not after it
        config = preflight.fetch_models(config, HubSettings.from_env(args.env))
        preflight.check(config)  # a taken port, a missing model: before Ray or the model
    except HubError as error:
        raise CommandError(str(error), error.status)
    except (ValueError, OSError) as error:
        raise UsageError(str(error))
    from engine.server.running import lifecycle  # MLX and Ray load here, and only here

    sidecars = [bridge_sidecar(config)] if config.server.http_port else []
    try:
        return int(lifecycle.run(config, sidecars) or 0)
    except lifecycle.StartError as error:  # a port or an actor name taken after the check
        raise UsageError(str(error))


def bridge_sidecar(config: EngineConfig, quiet: bool = False):
    """Start the OpenAI bridge in front of the engine once it serves (`--http-port`): in the
    engine's process, calling its front end directly (no gRPC loopback)."""
    from clients.bridge.in_process import InProcessBackend
    from clients.bridge.server import bridge_options, bridge_security, start_bridge

    host, port = config.server.host, config.server.http_port
    security = bridge_security(config.server, config.limits)
    options = bridge_options(config)

    async def start(engine):
        from engine.server.running.serve import StartError

        backend = InProcessBackend(engine)
        try:
            handle = await start_bridge(backend, host, port, security, options)
        except OSError as error:  # taken since the check (engine.server.running.preflight)
            flag = label_of(ServerConfig, "http_port")
            raise StartError(f"{flag}: cannot listen on {host}:{port}: {error.strerror or error}")
        if not quiet:
            print(f"lineage: OpenAI-compatible bridge on {handle.url}/v1", flush=True)
        return handle

    return start
