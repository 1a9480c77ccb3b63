"""`lineage bench <name>`: benchmarks, commands that print figures measured in one run.

Each benchmark is a module of this package, `clients.bench.<name>`, with
`HELP` (one line), `add_arguments(parser)` and `run(args) -> int`; importing
it is cheap (MLX, Ray and matplotlib load inside `run`). What they share lives
in `figures` (percentiles, tables, JSON, plots) and `harness` (their own Ray,
the serve flags' EngineConfig, the model directory). Speed is shown here, in
figures and ratios measured in one run, never by timed tests.

`BENCHES` names them. The plug-in interface below (`HELP`, `add_arguments`,
`run`) serves today's `clients/cli.py`, which loads this package as the
`bench` subcommand.
"""

from __future__ import annotations

import argparse
import importlib

from clients.bench.figures import plot_ready

HELP = "benchmarks: warm turns, checkpoint bytes, agent traffic, warm restarts, concurrency"

# subcommand -> module; add one here and write the module.
BENCHES = {
    "warm": "clients.bench.warm",
    "checkpoint": "clients.bench.checkpoint",
    "agents": "clients.bench.agents",
    "restart": "clients.bench.restart",
    "kernels": "clients.bench.kernels",
    "concurrency": "clients.bench.concurrency",
    "load": "clients.bench.load",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True)
    for name, module_name in BENCHES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:  # an optional dependency is missing: say which
            p = sub.add_parser(name, help=f"(unavailable: {error.name} is not installed)")
            p.set_defaults(missing=error.name)
            continue
        p = sub.add_parser(name, help=module.HELP)
        module.add_arguments(p)
        p.set_defaults(bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "missing", None):
        extra = "pip install 'lineage-engine[bench]'"
        print(f"lineage bench {args.bench}: needs {args.missing} ({extra})")
        return 1
    if not plot_ready(args, f"lineage bench {args.bench}"):
        return 1
    return int(args.bench_run(args) or 0)
