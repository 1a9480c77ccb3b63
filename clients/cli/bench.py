"""`lineage bench NAME ...`: a thin shell over the benchmarks of clients/bench.

`BENCHES` names each benchmark's module and its one-line help, so `lineage bench
-h` lists them without importing any. `lineage bench NAME args...` imports
clients.bench.NAME alone, parses the rest with that module's
`add_arguments(parser)` and calls its `run(args) -> int`. A benchmark whose
optional dependency is missing, or a `--plot` without matplotlib, is refused in
one line naming the extra to install. Every benchmark takes `--kernels ours|peers`
(engine.config.kernels: our engine/kernels/, or none of them as every MLX server
runs), set for the whole run and named in its output.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os

from clients.cli.args import add_settings
from engine.config import KernelConfig
from engine.config.declare import setting_named

HELP = (
    "benchmarks: warm turns, checkpoint bytes, agent traffic, warm restarts, concurrency, "
    "slow clients, soak"
)
EXTRA = "pip install 'lineage-engine[bench]'"
# name -> (module, one line of help: the module's HELP)
BENCHES = {
    "warm": ("clients.bench.warm", "time to first token of a short turn on a long conversation"),
    "checkpoint": (
        "clients.bench.checkpoint",
        "checkpoint bytes vs entry bytes at 1k and 8k tokens",
    ),
    "agents": (
        "clients.bench.agents",
        "agent traffic against lineage, exact, off and mlx-lm's prompt cache, beside the oracle",
    ),
    "restart": (
        "clients.bench.restart",
        "warm restarts from the disk tier: time to first token, writer MB/s, decode under writes",
    ),
    "kernels": (
        "clients.bench.kernels",
        "sparse-attention, gated-delta, dense-attention and host-linear kernels against the "
        "stock paths",
    ),
    "concurrency": (
        "clients.bench.concurrency",
        "concurrent sub-agents plus long cold prompts: TTFT, ITL and prefill rate per schedule",
    ),
    "decode": (
        "clients.bench.decode",
        "decode tokens/s layer by layer (loop, gRPC, bridge) beside mlx_lm, mlx-vlm, Rapid-MLX",
    ),
    "speculative": (
        "clients.bench.speculative",
        "speculative decoding: decode tokens/s per draft mode against off, three traffics",
    ),
    "load": (
        "clients.bench.load",
        "load: concurrent sessions on a small RAM budget, then a burst past the queue",
    ),
    "slowloris": (
        "clients.bench.slowloris",
        "slow clients: slow connections to the bridge while agents run, TTFT beside none",
    ),
    "faults": (
        "clients.bench.faults",
        "faults: kill the manager and a replica, stall a loop, fill the disk, under agent traffic",
    ),
    "soak": (
        "clients.bench.soak",
        "soak: a real serve under agent traffic and faults for M minutes; what grows, what drifts",
    ),
    "memory": (
        "clients.bench.memory",
        "cache bytes and times at the shapes users run (checkpoint, KV, tiers, disk)",
    ),
    "simulate": (
        "clients.bench.simulate",
        "our prefill policy against FCFS whole prefill (mlx-vlm's), simulated on a Mac's costs",
    ),
    "structured": (
        "clients.bench.structured",
        "structured output: decode held to a tool schema vs free, mask and compile time, n=4 vs 4",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    width = max(map(len, BENCHES))
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "benchmarks:\n" + "\n".join(
        f"  {name:<{width}}  {help}" for name, (_, help) in BENCHES.items()
    )
    parser.add_argument("bench", choices=BENCHES, metavar="NAME", help="the benchmark to run")
    parser.add_argument(
        "rest", nargs=argparse.REMAINDER, metavar="ARGS", help="its flags (lineage bench NAME -h)"
    )


def run(args: argparse.Namespace) -> int:
    module_name, _ = BENCHES[args.bench]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        if error.name is None or error.name.split(".")[0] in ("clients", "engine"):
            raise  # our own code is broken: not a missing extra
        print(f"lineage bench {args.bench}: needs {error.name} ({EXTRA})")
        return 1
    parser = argparse.ArgumentParser(prog=f"lineage bench {args.bench}", description=module.HELP)
    module.add_arguments(parser)
    if "--kernels" not in parser._option_string_actions:  # not among the serve flags it took
        add_settings(parser, [setting_named(KernelConfig, "kernels")])
    try:
        bench_args = parser.parse_args(args.rest)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    bench_args.bench, bench_args.env = args.bench, args.env
    if bench_args.kernels:  # every engine of the run, its Ray workers and subprocesses
        from clients.bench.harness import KERNELS_VAR

        os.environ[KERNELS_VAR] = bench_args.kernels
    return launch(bench_args, module.run)


def launch(args: argparse.Namespace, run_bench) -> int:
    """Run a benchmark on its parsed flags; refused when --plot lacks matplotlib."""
    if getattr(args, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        print(f"lineage bench {args.bench}: --plot needs matplotlib ({EXTRA})")
        return 1
    return int(run_bench(args) or 0)
