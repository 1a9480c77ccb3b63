"""`lineage bench <name>`: benchmarks, commands that print figures measured in one run.

One interface for all: each benchmark is a module of this package with
`HELP`, `add_arguments(parser)` and `run(args) -> int`, imported only when
the `bench` subcommand is parsed, so the CLI stays cheap to import. Speed is
shown here, in figures and ratios measured in one run, never by timed tests.
Benchmarks that run the engine in process (`warm`, `checkpoint`) take the
serve flags and build the same EngineConfig as `lineage serve`
(`engine_config`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os

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
    if getattr(args, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        print(f"lineage bench {args.bench}: --plot needs matplotlib (pip install -e '.[bench]')")
        return 1
    return int(args.bench_run(args) or 0)


def engine_config(args: argparse.Namespace):
    """The EngineConfig of the serve flags given, plus the environment (as `lineage serve`)."""
    from clients.cli import config_from_args

    return config_from_args(args, getattr(args, "env", None) or os.environ)


@contextlib.contextmanager
def own_ray(needed: bool = True):
    """A Ray of the benchmark's own for the run, never another user's cluster.

    Nothing is started when `needed` is false or a Ray is already up in this process.
    """
    import ray

    started = needed and not ray.is_initialized()
    if started:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(
            address="local",
            num_cpus=os.cpu_count() or 2,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
        )
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def emit(report: dict, args: argparse.Namespace, format_table, plot) -> int:
    """Print a report's table; write --json and --plot when asked."""
    print(format_table(report))
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if getattr(args, "plot", None):
        plot(report, args.plot)
    return 0
