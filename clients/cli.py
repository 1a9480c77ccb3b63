"""The `lineage` command: serve, generate, chat, fanout, stats (and plug-ins).

Parses arguments and hands plain values to the client library or to
`engine.server.serve.run(config)`. Only `lineage serve` imports the engine's runtime
(MLX, Ray), lazily; every other subcommand needs grpc alone.

Subcommands live in a registry (`COMMANDS`). Another module adds one with
`register(Command(...))`, or by being named in `PLUGINS`: such a module defines
`HELP` (one line), `add_arguments(parser)` and `run(args) -> int`, and must be
cheap to import. A plug-in module that is not there yet is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

from clients.chat import ProgressBar
from clients.client import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_SERVER,
    Chunk,
    Client,
    LineageError,
    Progress,
    Result,
)
from engine.config import (
    CACHE_MODES,
    GATED_DELTA_MODES,
    METRICS_NAMESPACE_TAGS,
    PREFILL_EVALS,
    SCHEDULES,
    EngineConfig,
    Limits,
    parse_bytes,
)

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# Serve flags, as named by EngineConfig.from_sources.
SERVE_FLAGS = (
    "model",
    "cache_dir",
    "cache_mode",
    "ram_budget",
    "disk_budget",
    "disk_queue_limit",
    "guard_min_suffix",
    "host",
    "port",
    "address",
    "replicas",
    "route_threshold",
    "http_port",
    "prefill_step_size",
    "max_batch",
    "ray_namespace",
    "metrics_port",
    "schedule",
    "prefill_budget",
    "prefill_group",
    "prefill_step_factor",
    "prefill_slice_ms",
    "prefill_overlap",
    "prefill_eval",
    "sparse_kernels",
    "sparse_decode_max",
    "sparse_gather_max",
    "sparse_block",
    "gated_delta",
    "dense_kernel",
    "dense_min_keys",
    "max_queue",
    "max_batch_tokens",
    "memory_limit",
    "max_restarts",
    "call_deadline",
    "stream_deadline",
    "loop_deadline",
    "max_concurrent_rpcs",
)
# Limits on client input (engine.config.Limits), each a serve flag.
LIMIT_FLAGS = tuple(f.name for f in dataclasses.fields(Limits))
# Serve flags that secure the engine (and `lineage bridge`), as EngineConfig names them.
SECURITY_FLAGS = (
    "auth_token",
    "auth_token_file",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "insecure",
    "reflection",
    "exact_cache_figures",
)
# Subcommands that other modules provide: name -> module.
PLUGINS = {
    "bench": "clients.bench",
    "cache": "clients.cache",
    "bridge": "clients.bridge",
    "top": "clients.top",
}


class UsageError(Exception):
    """Bad input found after parsing (an unreadable file, ...): exit 2."""


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def register(command: Command) -> Command:
    """Add a subcommand to the registry (a later one with the same name replaces it)."""
    COMMANDS[command.name] = command
    return command


def _load_plugins() -> None:
    for name, module_name in PLUGINS.items():
        if name in COMMANDS:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:
                continue  # not written yet
            raise
        register(Command(name, module.HELP, module.add_arguments, module.run))


# ---------------------------------------------------------------- helpers ----


def _byte_size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error))


def _read_json(path: str, what: str):
    """Load a JSON file ("-" reads stdin); UsageError naming the file on failure."""
    try:
        if path == "-":
            return json.load(sys.stdin)
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read {what} from {path}: {error}")


def _read_json_list(path: str | None, what: str) -> list | None:
    if path is None:
        return None
    value = _read_json(path, what)
    if not isinstance(value, list):
        raise UsageError(f"{what} file {path} must hold a JSON list")
    return value


def _add_server(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        metavar="HOST:PORT",
        help=f"engine address (default: $LINEAGE_SERVER or {DEFAULT_SERVER})",
    )
    add_connect_arguments(p)


def add_connect_arguments(p: argparse.ArgumentParser) -> None:
    """How a client command reaches the engine: its token and TLS files."""
    p.add_argument(
        "--auth-token", metavar="TOKEN", help="bearer token (default: $LINEAGE_AUTH_TOKEN)"
    )
    p.add_argument(
        "--tls-ca", metavar="PEM", help="CA to verify the server by (default: $LINEAGE_TLS_CA)"
    )
    p.add_argument(
        "--tls-client-cert",
        metavar="PEM",
        help="client certificate for mTLS ($LINEAGE_TLS_CLIENT_CERT)",
    )
    p.add_argument(
        "--tls-client-key", metavar="PEM", help="its private key ($LINEAGE_TLS_CLIENT_KEY)"
    )


def connect_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> dict:
    """Keyword arguments of Client/AsyncClient: flags first, then the environment."""
    from clients.channel import Security

    try:
        s = Security.from_env(
            getattr(args, "auth_token", None),
            None,
            getattr(args, "tls_ca", None),
            getattr(args, "tls_client_cert", None),
            getattr(args, "tls_client_key", None),
            env,
        )
    except ValueError as error:
        raise UsageError(str(error))
    return dict(
        auth_token=s.auth_token, tls=s.tls, tls_ca=s.tls_ca, tls_cert=s.tls_cert, tls_key=s.tls_key
    )


def _add_sampling(p: argparse.ArgumentParser, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=0.0, help="0 or 1: off")
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)"
    )
    p.add_argument("--namespace", default="", help="cache namespace")


def sampling_from_args(args: argparse.Namespace) -> dict:
    """The generate() keyword arguments of the sampling flags."""
    return {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "stop": args.stop,
        "namespace": args.namespace,
    }


# ------------------------------------------------------------------ serve ----


def serve_arguments(p: argparse.ArgumentParser) -> None:
    # Every default is None: EngineConfig.from_sources sees only the flags given.
    p.add_argument("--model", metavar="PATH", help="model directory (default: embedded tiny model)")
    p.add_argument("--host", help="gRPC bind host (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="gRPC port (default 50051)")
    p.add_argument("--cache-dir", help="disk tier directory")
    p.add_argument("--cache-mode", choices=CACHE_MODES)
    p.add_argument("--ram-budget", type=_byte_size, metavar="SIZE", help="e.g. 48G")
    p.add_argument("--disk-budget", type=_byte_size, metavar="SIZE", help="e.g. 1T")
    p.add_argument(
        "--disk-queue-limit",
        type=_byte_size,
        metavar="SIZE",
        help="bytes of file writes queued; past it a write is refused (default a quarter "
        "of the RAM budget, at least 256M; env LINEAGE_DISK_QUEUE_LIMIT)",
    )
    p.add_argument(
        "--guard-min-suffix",
        type=int,
        metavar="TOKENS",
        help="capture a guard (prompt minus 16) when the uncached suffix is this long "
        "(default: derived from the per-forward and per-token costs measured at load; "
        "env LINEAGE_GUARD_MIN_SUFFIX)",
    )
    p.add_argument("--address", metavar="RAY_ADDR", help="join a Ray cluster (e.g. auto)")
    p.add_argument("--http-port", type=int, help="OpenAI bridge port (off by default)")
    p.add_argument(
        "--replicas",
        metavar="N|auto",
        help="model replicas (default 1; auto: one per `mlx` resource of the Ray cluster)",
    )
    p.add_argument(
        "--route-threshold",
        type=int,
        metavar="TOKENS",
        help="queued prefill tokens by which the replica holding a restore point may exceed "
        "the least loaded one before a request goes to the latter (default 4096)",
    )
    p.add_argument("--prefill-step-size", type=int)
    p.add_argument("--max-batch", type=int)
    p.add_argument(
        "--ray-namespace", help="Ray namespace the actors are named in (default lineage)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve Prometheus metrics at http://127.0.0.1:P/metrics (off by default)",
    )
    p.add_argument(
        "--metrics-namespace",
        choices=METRICS_NAMESPACE_TAGS,
        help="the cache namespace in metrics and `lineage top`: hash (default), plain or off",
    )
    p.add_argument(
        "--schedule",
        choices=SCHEDULES,
        help="prefill order: srpt (shortest remaining first, default), fifo, or batched "
        "(mlx-lm's padded prefill batch, the baseline) (env LINEAGE_SCHEDULE)",
    )
    p.add_argument(
        "--prefill-budget",
        type=int,
        metavar="TOKENS",
        help="most prompt tokens per step under srpt/fifo; a prefill this short runs whole "
        "(default 256; env LINEAGE_PREFILL_BUDGET)",
    )
    p.add_argument(
        "--prefill-group",
        type=int,
        metavar="N",
        help="prefill up to N not-yet-started prompts of similar length in one chunk "
        "(default 1; env LINEAGE_PREFILL_GROUP)",
    )
    p.add_argument(
        "--prefill-step-factor",
        type=float,
        metavar="X",
        help="srpt/fifo: a step that prefills beside decode aims at X idle decode steps "
        "(default 2.5; env LINEAGE_PREFILL_STEP_FACTOR)",
    )
    p.add_argument(
        "--prefill-slice-ms",
        type=float,
        metavar="MS",
        help="srpt/fifo: a long prompt's chunk with nothing decoding aims at MS ms "
        "(default 50; env LINEAGE_PREFILL_SLICE_MS)",
    )
    p.add_argument(
        "--prefill-overlap",
        choices=("on", "off"),
        help="srpt/fifo: run a prefill chunk's forward on a thread of its own beside the "
        "decode steps (default on; env LINEAGE_PREFILL_OVERLAP)",
    )
    p.add_argument(
        "--prefill-eval",
        choices=PREFILL_EVALS,
        help="with overlap, the worker evaluates a long prefill's chunk module by module "
        "(its MLX queue stays short beside decode) or whole; auto: module on the CPU "
        "(default auto; env LINEAGE_PREFILL_EVAL)",
    )
    p.add_argument(
        "--sparse-kernels",
        choices=("on", "off"),
        help="DSA short-chunk attention paths (default on; off: mlx-lm's stock path) "
        "(env LINEAGE_SPARSE_KERNELS)",
    )
    p.add_argument(
        "--sparse-decode-max",
        type=int,
        metavar="N",
        help="DSA chunks of 2..N tokens take the decode shape (default 128; "
        "env LINEAGE_SPARSE_DECODE_MAX)",
    )
    p.add_argument(
        "--sparse-gather-max",
        type=int,
        metavar="N",
        help="DSA chunks up to N tokens take block-gather (default 512; "
        "env LINEAGE_SPARSE_GATHER_MAX)",
    )
    p.add_argument(
        "--sparse-block",
        type=int,
        metavar="N",
        help="block-gather block size in tokens (default 64; env LINEAGE_SPARSE_BLOCK)",
    )
    p.add_argument(
        "--gated-delta",
        choices=GATED_DELTA_MODES,
        help="gated delta recurrence off Metal: mx.fast primitive or mlx-lm's op loop "
        "(default auto: the primitive off Metal; env LINEAGE_GATED_DELTA)",
    )
    p.add_argument(
        "--dense-kernel",
        choices=("on", "off"),
        help="dense attention on the CPU backend through the host BLAS (default on; off: "
        "MLX's fused op) (env LINEAGE_DENSE_KERNEL)",
    )
    p.add_argument(
        "--dense-min-keys",
        type=int,
        metavar="N",
        help="the host path from N keys (default 1024; env LINEAGE_DENSE_MIN_KEYS)",
    )
    p.add_argument("--max-queue", type=int, help="requests in flight (default 256)")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        help="prompt + max_tokens of the running sequences together (default: from memory)",
    )
    p.add_argument(
        "--memory-limit",
        type=_byte_size,
        metavar="SIZE",
        help="weights + running KV + RAM tier + pool (default 3/4 of RAM)",
    )
    p.add_argument("--max-restarts", type=int, help="per actor (default -1: no limit)")
    p.add_argument("--call-deadline", type=float, metavar="S", help="actor calls (default 30)")
    p.add_argument(
        "--stream-deadline", type=float, metavar="S", help="longest stream silence (default 300)"
    )
    p.add_argument(
        "--loop-deadline", type=float, metavar="S", help="model loop health ping (default 10)"
    )
    p.add_argument("--max-concurrent-rpcs", type=int, help="gRPC's limit (default max-queue + 64)")
    add_security_arguments(p)
    add_limit_arguments(p)
    p.add_argument(
        "--reflection",
        action="store_true",
        default=None,
        help="serve gRPC reflection on any host ($LINEAGE_REFLECTION; default: loopback only)",
    )
    p.add_argument(
        "--exact-cache-figures",
        action="store_true",
        default=None,
        help="send clients exact cached-token figures, not rounded to 64 "
        "($LINEAGE_EXACT_CACHE_FIGURES)",
    )


def add_limit_arguments(p: argparse.ArgumentParser, only: tuple[str, ...] = LIMIT_FLAGS) -> None:
    """The limits on client input (engine.config.Limits): `--max-...`, `LINEAGE_MAX_...`."""
    group = p.add_argument_group("limits on client input")
    for f in dataclasses.fields(Limits):
        if f.name not in only:
            continue
        size = f.name.endswith("_bytes")
        group.add_argument(
            "--" + f.name.replace("_", "-"),
            type=_byte_size if size else int,
            metavar="SIZE" if size else "N",
            help=f"default {f.default} (${'LINEAGE_' + f.name.upper()})",
        )


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    """Tokens and TLS of a server (`lineage serve`, `lineage bridge`); each has an env var."""
    p.add_argument(
        "--auth-token", metavar="TOKEN", help="the operator's token ($LINEAGE_AUTH_TOKEN)"
    )
    p.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="tokens, one `TOKEN [NAMESPACE] [admin]` a line ($LINEAGE_AUTH_TOKEN_FILE)",
    )
    p.add_argument(
        "--tls-cert", metavar="PEM", help="serve TLS with this certificate ($LINEAGE_TLS_CERT)"
    )
    p.add_argument("--tls-key", metavar="PEM", help="its private key ($LINEAGE_TLS_KEY)")
    p.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="require client certificates signed by this CA: mTLS ($LINEAGE_TLS_CLIENT_CA)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a non-loopback bind without a token ($LINEAGE_INSECURE)",
    )


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> EngineConfig:
    """The EngineConfig of `lineage serve` flags (only those given) plus `env`."""
    flags = {name: getattr(args, name, None) for name in SERVE_FLAGS + SECURITY_FLAGS + LIMIT_FLAGS}
    return EngineConfig.from_sources({k: v for k, v in flags.items() if v is not None}, env)


def _serve(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args, args.env)
        config.server.check_exposure()
    except (ValueError, OSError) as error:
        raise UsageError(str(error))
    from engine.server import serve  # MLX and Ray load here, and only here

    sidecars = []
    if config.server.http_port:
        sidecars.append(_bridge_sidecar(config))
    return int(serve.run(config, sidecars) or 0)


def _bridge_sidecar(config: EngineConfig):
    """Start the OpenAI bridge in front of the engine once it serves (`--http-port`)."""
    # fails here, before Ray starts, if not installed
    from clients.bridge import bridge_security, start_bridge

    host, port = config.server.host, config.server.http_port
    security = bridge_security(config.server, config.limits)

    async def start(grpc_address: str):
        handle = await start_bridge(grpc_address, host, port, security)
        print(f"lineage: OpenAI-compatible bridge on {handle.url}/v1", flush=True)
        return handle

    return start


# --------------------------------------------------------------- generate ----


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--messages", metavar="FILE.json", help="a JSON list of {role, content}")
    source.add_argument("--prompt", metavar="TEXT", help="raw prompt text")
    p.add_argument("--tools", metavar="FILE.json", help="a JSON list of tool definitions")
    p.add_argument("--stop-token-id", type=int, action="append", default=[], metavar="ID")
    p.add_argument("--json", action="store_true", help="print one JSON object (the Result)")
    _add_sampling(p)
    _add_server(p)


def _print_stream(stream) -> Result:
    """Write chunks to stdout as they arrive, a prefill bar to a terminal stderr."""
    bar = ProgressBar(sys.stderr)
    for event in stream:
        if isinstance(event, Progress):
            bar.update(event)
        elif isinstance(event, Chunk):
            bar.clear()
            sys.stdout.write(event.text)
            sys.stdout.flush()
    bar.clear()
    sys.stdout.write("\n")
    return stream.result()


def _generate(args: argparse.Namespace) -> int:
    if args.tools and not args.messages:
        raise UsageError("--tools needs --messages")
    request = dict(
        messages=_read_json_list(args.messages, "messages"),
        tools=_read_json_list(args.tools, "tools"),
        prompt=args.prompt,
        stop_token_ids=args.stop_token_id,
        **sampling_from_args(args),
    )
    with Client(args.server, **args.connect) as client:
        try:
            stream = client.stream(**request)
        except ValueError as error:
            raise UsageError(str(error))
        if args.json:
            print(json.dumps(stream.result().to_json_dict()))
        else:
            _print_stream(stream)
    return EXIT_OK


# ------------------------------------------------------------ chat, stats ----


def _chat_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("--tools", metavar="FILE.json", help="a JSON list of tool definitions")
    _add_sampling(p)
    _add_server(p)


def _chat(args: argparse.Namespace) -> int:
    from clients.chat import main_chat

    return main_chat(
        args.server,
        args.system,
        _read_json_list(args.tools, "tools"),
        sampling_from_args(args),
        args.connect,
    )


def _stats_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="print the counters and the live figures of `lineage top` as JSON",
    )
    _add_server(p)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_stats(stats: dict) -> str:
    """A CacheStats dict as a two-column table; byte counters human-readable."""
    lines = []
    for key, value in stats.items():
        if key == "replicas":
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
        elif key.endswith("_bytes"):
            value = f"{_human_bytes(value)} ({value})"
        lines.append(f"{key:<16} {value}")
    if stats.get("prompt_tokens"):
        fraction = stats["cached_tokens"] / stats["prompt_tokens"]
        lines.append(f"{'cached_fraction':<16} {fraction:.1%}")
    for r in stats.get("replicas", ()):
        restores = ", ".join(f"{k}={v}" for k, v in sorted(r["restores"].items())) or "-"
        lines.append(
            f"replica {r['replica']:<8} {'alive' if r['alive'] else 'DOWN'}, "
            f"entries={r['entries']} ({_human_bytes(r['ram_bytes'])}), "
            f"queued={r['queued_prefill_tokens']} tokens, in_flight={r['in_flight']}, "
            f"served={r['requests']}, restores: {restores}, "
            f"handovers={r['handovers']} ({_human_bytes(r['handover_bytes'])})"
        )
    return "\n".join(lines)


def _stats(args: argparse.Namespace) -> int:
    with Client(args.server, **args.connect) as client:
        if not args.json:
            print(format_stats(client.cache_stats()))
            return EXIT_OK
        live = client.inspect()
    # The CacheStats counters at the top, then the live figures `lineage top` shows.
    print(json.dumps({**live.pop("cache"), **live}, indent=2))
    return EXIT_OK


# ----------------------------------------------------------------- fanout ----


def _fanout_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", type=int, required=True, metavar="N")
    p.add_argument("--turns", type=int, required=True, metavar="T")
    p.add_argument(
        "--system-tokens",
        type=int,
        default=2000,
        help="shared system prompt plus tools, in estimated tokens",
    )
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--namespace", default="")
    p.add_argument("--json", metavar="FILE", help="write {rows, summary} to FILE")
    _add_server(p)


def _fanout(args: argparse.Namespace) -> int:
    from clients import fanout

    for flag in ("agents", "turns", "system_tokens", "max_tokens"):
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be > 0")
    rows = asyncio.run(
        fanout.run_fanout(
            args.server,
            args.agents,
            args.turns,
            args.system_tokens,
            args.max_tokens,
            args.seed,
            args.namespace,
            args.connect,
        )
    )
    print(fanout.format_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(fanout.rows_to_json(rows), f, indent=2)
    return EXIT_OK


for _command in (
    Command("serve", "run the engine (Ray, model actors, gRPC server)", serve_arguments, _serve),
    Command("generate", "send one request and stream the reply", _generate_arguments, _generate),
    Command("chat", "interactive multi-turn chat", _chat_arguments, _chat),
    Command("fanout", "parallel sub-agents sharing one system prompt", _fanout_arguments, _fanout),
    Command("stats", "show the engine's cache counters", _stats_arguments, _stats),
):
    register(_command)


# ------------------------------------------------------------------- main ----


def build_parser() -> argparse.ArgumentParser:
    """The `lineage` parser with every registered subcommand (plug-ins loaded)."""
    _load_plugins()
    parser = argparse.ArgumentParser(prog="lineage", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS.values():
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run `lineage` with `argv` (default sys.argv[1:]) and `env` (default os.environ).

    Returns the exit status: 0 ok, 1 a failed call, 2 a usage error, 130 interrupted.
    """
    env = os.environ if env is None else env
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    args.env = env
    if hasattr(args, "server") and not args.server:
        args.server = env.get("LINEAGE_SERVER") or DEFAULT_SERVER
    try:
        args.connect = connect_from_args(args, env)
        return args.run(args)
    except UsageError as error:
        print(f"lineage {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except LineageError as error:
        print(f"lineage {args.command}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
