"""`lineage bench warm|checkpoint|agents|restart`: benchmarks, commands that print figures.

Each benchmark lives in engine/bench/ and is imported only when its
subcommand runs, so the CLI stays cheap to import. Speed is shown here, in
figures and ratios measured in one run, never by timed tests.
"""

from __future__ import annotations

import argparse
import importlib
import os

HELP = "benchmarks: warm turns, checkpoint bytes, agent traffic, warm restarts"

# name -> (module, help); each module has add_arguments(parser) and run(...).
BENCHES = {
    "warm": ("engine.bench.warm", "time to first token of a short turn on a long conversation"),
    "checkpoint": ("engine.bench.checkpoint", "checkpoint bytes vs entry bytes at 1k and 8k"),
    "agents": ("engine.bench.agents", "agent traffic: lineage vs exact vs off vs mlx-lm"),
    "restart": ("engine.bench.restart", "warm restarts from the disk tier"),
}
# Benchmarks that run the engine in process take the serve flags and a config.
IN_PROCESS = ("warm", "checkpoint")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from clients.cli import _serve_arguments

    sub = parser.add_subparsers(dest="bench", required=True)
    for name, (module_name, help_text) in BENCHES.items():
        p = sub.add_parser(name, help=help_text)
        if name in IN_PROCESS:
            _serve_arguments(p)
            _add_own_arguments(name, p)
        else:
            try:
                importlib.import_module(module_name).add_arguments(p)
            except ImportError:
                p.set_defaults(missing=module_name)


def _add_own_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "warm":
        p.add_argument("--context", type=int, default=8192, help="conversation length")
        p.add_argument("--turns", type=int, default=5, help="short turns (medians over them)")
        p.add_argument("--new-tokens", type=int, default=20, help="new tokens per short turn")
        p.add_argument("--json", help="write the figures to this file")
    else:
        importlib.import_module(BENCHES[name][0]).add_arguments(p)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "missing", None):
        print(f"lineage bench {args.bench}: {args.missing} is not available")
        return 1
    module = importlib.import_module(BENCHES[args.bench][0])
    if args.bench not in IN_PROCESS:
        return int(module.run(args) or 0)
    from clients.cli import config_from_args

    config = config_from_args(args, getattr(args, "env", None) or os.environ)
    if args.bench == "warm":
        return int(module.main(config, args) or 0)
    return int(module.run(config, args) or 0)
