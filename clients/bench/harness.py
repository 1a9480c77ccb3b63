"""What a benchmark starts: its own Ray, the serve flags' EngineConfig, the model directory.

Every benchmark runs with one kernel set (`kernel_set`: `--kernels ours|peers`,
our engine/kernels/ or none of them, as every MLX server runs).
The benchmarks that run the engine in process (`warm`, `checkpoint`) take the
serve flags and build the same EngineConfig as `lineage serve`; the ones that
start engines as actors do so on a Ray of their own, never on another user's
cluster. This module is the one place the benchmarks reach into the CLI (for
the serve flags). Ray and the engine's runtime are imported inside the
functions that start them, so importing a benchmark to build its parser is
cheap.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from clients.cli.args import add_serve_arguments, config_from_args

__all__ = [
    "add_engine_arguments",
    "add_serve_arguments",
    "bench_kernels",
    "cache_dir",
    "engine_config",
    "kernel_set",
    "model_path",
    "own_ray",
]
KERNELS_VAR = "LINEAGE_KERNELS"  # `lineage bench --kernels` sets it for the whole run


def kernel_set() -> str:
    """The kernels every engine of this run installs: `ours` or `peers` (`lineage bench
    NAME --kernels`, else LINEAGE_KERNELS, else ours). Named in every benchmark's output."""
    from engine.config import KERNEL_SETS

    value = os.environ.get(KERNELS_VAR) or "ours"
    if value not in KERNEL_SETS:
        raise ValueError(f"{KERNELS_VAR}: {value!r} is not one of {', '.join(KERNEL_SETS)}")
    return value


def bench_kernels():
    """The KernelConfig of `kernel_set` (for a benchmark that builds its EngineConfig)."""
    from engine.config import KernelConfig

    return KernelConfig(kernels=kernel_set())


def engine_config(args: argparse.Namespace):
    """The EngineConfig of the serve flags given, plus the environment (as `lineage serve`)."""
    return config_from_args(args, getattr(args, "env", None) or os.environ)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """`--model` and `--cache-dir`, as every benchmark that starts its own engine takes them."""
    parser.add_argument("--model", help="an mlx-lm model directory (default: the embedded one)")
    parser.add_argument("--cache-dir", help="cache directory (default: a temporary one)")


@contextlib.contextmanager
def cache_dir(given: str | None, name: str):
    """The cache directory `--cache-dir` named, or a temporary one, removed after the run."""
    path = Path(given or tempfile.mkdtemp(prefix=f"lineage-{name}-"))
    try:
        yield path
    finally:
        if not given:
            shutil.rmtree(path, ignore_errors=True)


def model_path(path: str | None) -> str:
    """`path`, or the embedded tiny model's directory (built on first use) when none is given."""
    if path:
        return path
    from engine.runtime.model.tiny_models import ensure_default_model

    return str(ensure_default_model())


@contextlib.contextmanager
def own_ray(needed: bool = True, logs: bool = False):
    """A Ray of the benchmark's own for the run, never another user's cluster.

    Nothing is started when `needed` is false or a Ray is already up in this
    process. `logs`: the actors' output is shown on this terminal.
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
            log_to_driver=logs,
        )
    try:
        yield
    finally:
        if started:
            ray.shutdown()
