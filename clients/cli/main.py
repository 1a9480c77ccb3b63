"""The `lineage` command: the top-level parser, and `main`.

Each subcommand is a module of this package with `HELP` (one line),
`add_arguments(parser)` and `run(args) -> int`, listed in `COMMANDS`. Building
the parser imports those modules only, and they are cheap: no MLX, no Ray, no
benchmark (`lineage bench` imports its benchmark when it runs). `main` parses,
fills the engine address and the connection from the environment, runs the
command and maps its failures to exit codes. It is every command's one way
out: a Ray the command started and left up is shut down there, with a deadline
(`lineage serve` stops its own within one; engine.server.running.lifecycle), and the
threads that ran MLX drop their state before they end
(engine.kernels.cpu_streams.release_thread), so no exit aborts.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping

from clients.cli import (
    bench,
    bridge,
    cache,
    chat,
    fanout,
    generate,
    models,
    pull,
    serve,
    stats,
    top,
)
from clients.cli.args import EXIT_ERROR, EXIT_USAGE, CommandError, UsageError, connect_from_args
from clients.client import DEFAULT_SERVER, LineageError

# In the order `lineage -h` lists them.
COMMANDS = {
    "serve": serve,
    "pull": pull,
    "models": models,
    "generate": generate,
    "chat": chat,
    "fanout": fanout,
    "stats": stats,
    "top": top,
    "cache": cache,
    "bridge": bridge,
    "bench": bench,
}


def build_parser() -> argparse.ArgumentParser:
    """The `lineage` parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="lineage", description="A serving engine for local hybrid LLMs, and its clients."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.HELP, description=command.HELP)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run `lineage` with `argv` (default sys.argv[1:]) and `env` (default os.environ).

    Returns the exit status: 0 ok, 1 a failed call, 2 a usage error, 130 interrupted,
    141 its output's reader went away.
    """
    env = os.environ if env is None else env
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    args.env = env
    if hasattr(args, "server") and not args.server:
        args.server = env.get("LINEAGE_SERVER") or DEFAULT_SERVER
    ray_before = _ray_up()
    try:
        args.connect = connect_from_args(args, env)
        return args.run(args)
    except UsageError as error:
        print(f"lineage {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except CommandError as error:
        print(f"lineage {args.command}: error: {error}", file=sys.stderr)
        return error.status
    except LineageError as error:
        print(f"lineage {args.command}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # a reader that stopped early (`lineage generate ... | head`)
        # Python would report the pipe again when it flushes stdout at exit: point it away.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports SIGPIPE (128 + 13)
    finally:
        if not ray_before and _ray_up():  # a Ray the command started and left up
            _stop_ray()


def _ray_up() -> bool:
    ray = sys.modules.get("ray")  # never imported here: a command that used none
    return ray is not None and ray.is_initialized()


def _stop_ray(within_s: float = 10.0) -> None:
    """Shut down a Ray the command left up, on a thread with a deadline (without its
    raylet `ray.shutdown` blocks); past it the process ends now, since Ray's exit
    hook would block the same way."""
    import ray

    from engine.server.running.stopping import end_process, within

    if not within(within_s, ray.shutdown):
        end_process(EXIT_ERROR, ["Ray's shutdown"])
