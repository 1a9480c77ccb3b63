"""`lineage bench agents`: one agent traffic against every cache policy, beside the oracle.

In one run, the same seeded traffic (clients.bench.agents.traffic) goes to
- the real server and model in `lineage`, `exact` and `off` cache modes: three
  engines started in this process one after the other, each with a fresh
  cache directory, driven through `Client` with one thread per lane;
- mlx-lm's own server prompt cache (`LRUPromptCache`, same model, same byte
  budget), driven as mlx_lm.server's batch path drives it: fetch_nearest_cache
  at admission, the system segment stored when its prefill ends, the rest
  prefilled, greedy decode, insert_cache of prompt + completion
  (clients.bench.agents.mlx_lm_cache);
- a real `mlx_lm.server` subprocess on the same model directory
  (clients.bench.peer), fed the same messages and tools through its OpenAI
  HTTP API, one thread per lane (a dropped stream hangs up after its drop
  point, as ours is cancelled there); and so mlx-vlm's server (`mlx_vlm`, its
  prefix cache on; asked by name, and by default under `--kernels peers`;
  clients.bench.peers makes its venv), skipped with its reason where it cannot run;
- with `--api chat,messages,responses`, instead of the above: the lineage engine
  behind the HTTP bridge, once per wire format (clients.bench.agents.wire_apis);
- the oracle (clients.bench.agents.observed): for each request, the longest prefix
  its prompt shares with the prompt of any request of an earlier step, or
  with prompt + completion of any earlier completed one (capped at the prompt
  length minus 1).

Requests of one step run concurrently; a step starts when the previous one has
ended, so "earlier" is the same for every policy. Replies are appended to the
conversations as each policy's model produced them, so each policy has its own
oracle; they coincide when the replies do. Prompt ids are rendered and
tokenized here exactly as the front end does, and checked against the
engine's `usage.prompt_tokens`.

The records are clients.bench.agents.observed's, the figures clients.bench.agents.report's.
Cheap to import: MLX, mlx-lm, Ray and matplotlib are imported inside the functions.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from clients.bench.agents.drive import drive
from clients.bench.agents.observed import PEER_SERVERS, POLICIES, Observed, PolicyRun
from clients.bench.agents.report import format_table, plot, summarize
from clients.bench.agents.traffic import Traffic, build_traffic
from clients.bench.figures import emit, plot_ready
from clients.bench.harness import kernel_set, model_path, own_ray

HELP = "agent traffic against lineage, exact, off and mlx-lm's prompt cache, beside the oracle"


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


# -------------------------------------------------------------- prompt ids ----


class PromptIds:
    """The front end's rendering and tokenization, in this process."""

    def __init__(self, model_path: str):
        from pathlib import Path

        from mlx_lm.utils import load_tokenizer

        from engine.server.prompts.prompt import PromptBuilder

        self.tokenizer = load_tokenizer(Path(model_path))
        self.builder = PromptBuilder(self.tokenizer, 1 << 30, 1 << 30)

    def encode(self, messages: list, tools) -> np.ndarray:
        """Prompt ids as the server builds them (through the wire format)."""
        from clients.client import build_request
        from engine.server.rpc.requests import to_prompt_input

        inp = to_prompt_input(build_request(messages=messages, tools=list(tools), max_tokens=1))
        return np.asarray(self.builder.build(inp).tokens, dtype=np.int32)

    def system_end(self, messages: list, tools, prompt: np.ndarray) -> int:
        """Where mlx_lm.server's "system" segment ends (0: none), as its _tokenize finds it."""
        lead = 0
        while lead < len(messages) and messages[lead]["role"] == "system":
            lead += 1
        if not lead or messages[-1]["role"] != "user":
            return 0
        text = self.builder.render(
            messages[:lead] + [{"role": "user", "content": ""}], tools, add_generation_prompt=False
        )
        head = self.tokenizer.encode(text, add_special_tokens=False)
        end = next((i for i, (a, b) in enumerate(zip(head, prompt.tolist())) if a != b), 0)
        return end if 0 < end < len(prompt) else 0


# ----------------------------------------------------------------- engines ----


def _send(client, spec, messages, tools, seed):
    """One request through the client; cancels after `drop_after` chunks.
    (ids, text, final, client's time to first token in ms)."""
    from clients.client import Chunk, Final

    ids, texts, chunks, final = [], [], 0, None
    t_send, t_first = time.perf_counter(), None
    stream = client.stream(
        messages=messages,
        tools=list(tools),
        max_tokens=spec.max_tokens,
        namespace=spec.namespace,
        temperature=0.0,
        seed=seed,
    )
    for event in stream:
        if isinstance(event, Chunk):
            if event.ids and t_first is None:
                t_first = time.perf_counter()
            ids += event.ids
            texts.append(event.text)
            chunks += 1
            if spec.drop_after and chunks >= spec.drop_after:
                stream.cancel()
                break
        elif isinstance(event, Final):
            final = event
    ttft_ms = ((t_first or time.perf_counter()) - t_send) * 1000
    return ids, "".join(texts), final, ttft_ms


def run_engine(
    mode: str,
    traffic: Traffic,
    opts: BenchOptions,
    ids: PromptIds,
    cache_dir: str,
    replicas: int = 1,
) -> PolicyRun:
    """The traffic against a fresh engine in cache mode `mode` on `replicas` model replicas
    (Ray must be initialized)."""
    from concurrent.futures import ThreadPoolExecutor

    from clients.client import Client
    from engine.server.running.background import BackgroundEngine

    config = _engine_config(mode, opts, cache_dir, replicas)
    files = _FilesSeen(cache_dir)
    with (
        BackgroundEngine(config, timeout=600) as engine,
        Client(engine.address, timeout=600) as client,
        ThreadPoolExecutor(max(1, traffic.agents)) as pool,
    ):

        def serve(batch):
            futures = [
                pool.submit(_send, client, spec, messages, traffic.tools, opts.seed)
                for spec, messages, _ in batch
            ]
            for (spec, _, prompt), future in zip(batch, futures):
                got, text, final, ttft_ms = future.result()
                yield _served(mode, spec, prompt, got, final, ttft_ms), text

        def sample():
            s = client.cache_stats()
            return {
                "ram_bytes": s["ram_bytes"],
                "disk_bytes": s["disk_bytes"],
                "evictions": s["evictions"],
                "disk_bytes_written": s.get("disk_bytes_written", files.written()),
            }

        run = drive(mode, traffic, ids, serve, sample)
        if replicas > 1:
            from clients.bench.agents.replicas import replica_figures

            run.name = f"{mode}_x{replicas}"
            run.replicas = replica_figures(engine, client, run.observed)
        return run


def _engine_config(mode: str, opts: BenchOptions, cache_dir: str, replicas: int):
    from clients.bench.harness import bench_kernels
    from engine.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig

    interval = {} if opts.message_interval is None else {"message_interval": opts.message_interval}
    return EngineConfig(
        model=ModelConfig(path=opts.model, prefill_step_size=opts.prefill_step_size),
        cache=CacheConfig(mode=mode, ram_budget=opts.ram_budget, cache_dir=cache_dir, **interval),
        kernels=bench_kernels(),
        server=ServerConfig(
            port=0,
            replicas=replicas,
            route_threshold=opts.route_threshold,
            ray_namespace=f"lineage-bench-{mode}-{replicas}",
        ),
    )


def _served(mode: str, spec, prompt, got: list, final, ttft_ms: float) -> Observed:
    """One request as our engine served it; its prompt must be the one rendered here."""
    done = final is not None and final.finish_reason != "cancelled"
    ob = Observed(spec.rid, spec.step, spec.lane, spec.kind, prompt, got, done)
    if final is not None and final.usage.prompt_tokens != len(prompt):
        raise RuntimeError(
            f"{mode}: request {spec.rid} has {final.usage.prompt_tokens} prompt "
            f"tokens on the server, {len(prompt)} rendered here"
        )
    if done:
        ob.cached, ob.ttft_ms = final.usage.cached_tokens, ttft_ms  # the client's
        ob.restore, ob.restore_length = final.restore.kind, final.restore.length
    return ob


class _FilesSeen:
    """Bytes written to a cache directory, as far as the files seen between steps tell.

    Entry files are written once under a name of their own (a temporary name,
    then a rename); every name seen counts once, at its largest size. A file
    written and deleted between two looks is missed.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.sizes: dict[str, int] = {}

    def written(self) -> int:
        for root, _, names in os.walk(self.directory):
            for name in names:
                if name.startswith("."):  # a temporary name
                    continue
                path = os.path.join(root, name)
                try:
                    size = os.path.getsize(path)
                except OSError:  # deleted meanwhile
                    continue
                self.sizes[path] = max(size, self.sizes.get(path, 0))
        return sum(self.sizes.values())


# ------------------------------------------------------------------ mlx-lm ----


def run_peer_server(
    name: str, traffic: Traffic, opts: BenchOptions, ids: PromptIds
) -> PolicyRun | str:
    """The traffic against a real peer server subprocess (`mlx_lm_server`, `mlx_vlm`:
    clients.bench.peers), concurrently per step; or why that peer cannot run here."""
    from concurrent.futures import ThreadPoolExecutor

    from clients.bench.concurrency.senders import PEER_RUNS
    from clients.bench.peers import start_or_reason

    server, reason = start_or_reason(PEER_RUNS[name], opts.model)
    if reason:
        return reason
    with server, ThreadPoolExecutor(max(1, traffic.agents)) as pool:

        def send(spec, messages):
            return server.stream(messages, traffic.tools, spec.max_tokens, spec.drop_after)

        def serve(batch):
            futures = [pool.submit(send, spec, messages) for spec, messages, _ in batch]
            for (spec, _, prompt), future in zip(batch, futures):
                reply = future.result()
                done = reply.completed
                completion = ids.tokenizer.encode(reply.text, add_special_tokens=False)
                ob = Observed(spec.rid, spec.step, spec.lane, spec.kind, prompt, completion, done)
                if done:
                    ob.cached, ob.ttft_ms = reply.cached_tokens, reply.ttft_ms
                yield ob, reply.text

        def sample():  # its cache figures are not exposed: only the replies' usage
            return {"ram_bytes": 0, "disk_bytes": 0, "evictions": 0, "disk_bytes_written": 0}

        return drive(name, traffic, ids, serve, sample)


def run_mlx_lm(traffic: Traffic, opts: BenchOptions, ids: PromptIds) -> PolicyRun:
    """The traffic against mlx-lm's LRUPromptCache, in this process, as its server drives it
    (clients.bench.agents.mlx_lm_cache)."""
    from clients.bench.agents.mlx_lm_cache import MlxLmPromptCache

    policy = MlxLmPromptCache(opts.model, opts.ram_budget, opts.prefill_step_size)

    def system_end(messages, prompt):
        return ids.system_end(messages, traffic.tools, prompt)

    return drive("mlx_lm", traffic, ids, lambda b: policy.serve(b, system_end), policy.sample)


# --------------------------------------------------------------------- run ----


def run_bench(opts: BenchOptions) -> dict:
    """Every policy on the same traffic; the report (JSON-ready). Ray must be initialized
    when an engine policy is asked for."""
    import shutil

    from clients.bench.agents import wire_apis
    from clients.bench.agents.replicas import parse

    unknown = [p for p in opts.policies if p not in POLICIES + PEER_SERVERS and not parse(p)]
    unknown += [a for a in opts.apis if a not in wire_apis.APIS]
    if unknown:
        raise ValueError(
            f"unknown policies or APIs {unknown} (use some of {', '.join(POLICIES)}; "
            f"--api: {', '.join(wire_apis.APIS)})"
        )
    traffic = build_traffic(opts.seed, opts.scale, opts.agents, opts.variants, opts.message_edits)
    ids = PromptIds(opts.model)
    runs, chain, skipped = {}, None, {}
    work = tempfile.mkdtemp(prefix="lineage-bench-agents-", dir=opts.work_dir)
    try:
        for api in opts.apis:  # one fresh engine and bridge per wire format
            path = os.path.join(work, api)
            config = _engine_config("lineage", opts, path, 1)
            runs[f"lineage_{api}"] = wire_apis.run_api(
                api, traffic, ids, config, os.path.join(path, "responses")
            )
        if "responses" in opts.apis:
            path = os.path.join(work, "chain")
            config = _engine_config("lineage", opts, path, 1)
            chain = wire_apis.chain_figures(traffic, ids, config, os.path.join(path, "responses"))
        for name in () if opts.apis else opts.policies:
            if name == "mlx_lm":
                runs[name] = run_mlx_lm(traffic, opts, ids)
            elif name in PEER_SERVERS:
                got = run_peer_server(name, traffic, opts, ids)
                if isinstance(got, str):
                    print(f"{name}: skipped: {got}", flush=True)
                    skipped[name] = got
                else:
                    runs[name] = got
            else:
                mode, count = parse(name) or (name, 1)
                path = os.path.join(work, name)
                runs[name] = run_engine(mode, traffic, opts, ids, path, count)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    phases = {r.rid: r.phase for r in traffic.requests if r.phase}
    policies = {name: summarize(run, phases) for name, run in runs.items()}
    first = next(iter(policies.values()))
    replies = {
        name: {o.rid: o.completion for o in run.observed if o.completed}
        for name, run in runs.items()
    }
    base = next(iter(replies.values()))
    apis = {}
    if opts.apis:
        shares = {api: policies[f"lineage_{api}"]["oracle_fraction"] for api in opts.apis}
        apis = {"oracle_fraction": shares, "spread": max(shares.values()) - min(shares.values())}
        apis |= {"chain": chain} if chain else {}
    return {
        "traffic": traffic.summary(),
        "model": opts.model,
        "ram_budget": opts.ram_budget,
        "oracle": {
            "cached_tokens": policies.get("lineage", first)["oracle_cached_tokens"],
            "per_policy": {n: p["oracle_cached_tokens"] for n, p in policies.items()},
            # Replies are the model's own: a policy whose replies differ has its own oracle.
            "replies_differ": [
                n for n, r in replies.items() if any(r.get(k, v) != v for k, v in base.items())
            ],
        },
        "policies": policies,
        **({"skipped": skipped} if skipped else {}),
        **({"apis": apis} if apis else {}),
    }


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


def run(args) -> int:
    """`lineage bench agents`: print the table; write --json and --plot when asked."""
    if not plot_ready(args, "lineage bench agents"):
        return 1
    opts = options_from_args(args)
    engines = opts.apis or [p for p in opts.policies if p != "mlx_lm" and p not in PEER_SERVERS]
    with own_ray(needed=bool(engines)):
        report = run_bench(opts)
    return emit(report, args, format_report, plot)


def format_report(report: dict) -> str:
    """The policies' table, then with --api the wire formats' spread and the chain's turns."""
    text = format_table(report)
    apis = report.get("apis")
    if not apis:
        return text
    from clients.bench.agents.wire_apis import format_chain

    shares = ", ".join(f"{a} {f:.2%}" for a, f in apis["oracle_fraction"].items())
    text += f"\ncached share of the oracle by wire format: {shares}; spread {apis['spread']:.2%}"
    return text + ("\n" + format_chain(apis["chain"]) if apis.get("chain") else "")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="lineage bench agents", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
