"""The options of `lineage bench agents`: its flags, and the BenchOptions built from them.

`add_arguments(parser)` declares the flags; `options_from_args(args)` reads them
into a frozen BenchOptions, the one object the runs are given (the embedded
model built when --model is absent, the RAM budget the engine's by default).
It knows the flags and their defaults; nothing of how a policy is run.
"""

from __future__ import annotations

from dataclasses import dataclass

from clients.bench.agents.observed import PEER_SERVERS, POLICIES
from clients.bench.harness import kernel_set, model_path


@dataclass(frozen=True)
class BenchOptions:
    model: str  # model directory (the embedded default is built by the caller)
    scale: float = 1.0
    agents: int | None = None
    seed: int = 0
    ram_budget: int = 48 << 30
    policies: tuple = POLICIES
    prefill_step_size: int = 512
    work_dir: str | None = None  # fresh cache directories go here (default: a temp dir)
    replicas: int = 1  # > 1: lineage on one replica against lineage on this many
    route_threshold: int = 4096  # the engine's --route-threshold (queued prefill tokens)
    variants: int = 4  # system-prompt-variant sessions at the end of the traffic
    message_edits: int = 4  # long-message sessions (an edit, a truncation) before them
    message_interval: int | None = None  # the engines' --message-interval; None: its default
    # wire formats (clients.bench.agents.wire_apis): the traffic through each instead
    apis: tuple = ()


def add_arguments(parser) -> None:
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="shrink the traffic (prefix size, sessions, turns, agents); 1.0: "
        "~10k-token prefix, 4 agents",
    )
    parser.add_argument("--agents", type=int, help="parallel sub-agents (default: from --scale)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model", metavar="PATH", help="model directory (default: the embedded tiny model)"
    )
    parser.add_argument(
        "--ram-budget",
        metavar="SIZE",
        help="RAM budget of every policy "
        "(default: the engine's, 48G capped at half the machine's memory)",
    )
    parser.add_argument(
        "--policies",
        help=f"comma-separated subset of {','.join(POLICIES + PEER_SERVERS[1:])} (default: "
        f"{','.join(POLICIES)}, and mlx_vlm under --kernels peers)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="N > 1: lineage on one replica against lineage on N (policies lineage,lineage_xN "
        "unless --policies says otherwise): cached tokens, ttft, throughput, handovers",
    )
    parser.add_argument(
        "--route-threshold",
        type=int,
        default=4096,
        metavar="TOKENS",
        help="the engines' --route-threshold (0: every request to the least loaded replica, "
        "which fetches its restore point from the holder)",
    )
    parser.add_argument(
        "--variants",
        type=int,
        default=4,
        metavar="N",
        help="system-prompt-variant sessions after the rest (one word changed deep inside "
        "the system prompt, a different word each), reported as their own phase",
    )
    parser.add_argument(
        "--message-edits",
        type=int,
        default=4,
        metavar="N",
        help="long-message sessions before the variants (a pasted file fixed near its end, "
        "a long tool result truncated in the next turn), reported as their own phase",
    )
    parser.add_argument(
        "--message-interval",
        type=int,
        metavar="TOKENS",
        help="the engines' --message-interval (default: the engine's)",
    )
    parser.add_argument(
        "--api",
        metavar="LIST",
        help="instead of the policies: the traffic through the HTTP bridge in each of these "
        "wire formats (comma-separated: chat,messages,responses), the cached share of each "
        "against the oracle, and with responses a 40-turn previous_response_id chain's bytes "
        "and prompt-building time per turn",
    )
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write the figure (matplotlib)")


def options_from_args(args) -> BenchOptions:
    """BenchOptions of the parsed flags; builds the embedded model when --model is absent."""
    from engine.config import EngineConfig, parse_bytes

    budget = (
        parse_bytes(args.ram_budget)
        if args.ram_budget
        else EngineConfig.from_sources({}, {}).cache.ram_budget
    )
    given = args.policies or ",".join(POLICIES + (("mlx_vlm",) if kernel_set() == "peers" else ()))
    policies = tuple(p.strip() for p in given.split(",") if p.strip())
    replicas = getattr(args, "replicas", 1) or 1
    if replicas > 1 and not args.policies:
        policies = ("lineage", f"lineage_x{replicas}")
    return BenchOptions(
        model=model_path(args.model),
        scale=args.scale,
        agents=args.agents,
        seed=args.seed,
        ram_budget=budget,
        policies=policies,
        replicas=replicas,
        route_threshold=getattr(args, "route_threshold", 4096),
        variants=getattr(args, "variants", 4),
        message_edits=getattr(args, "message_edits", 4),
        message_interval=getattr(args, "message_interval", None),
        apis=tuple(a.strip() for a in (getattr(args, "api", None) or "").split(",") if a.strip()),
    )
