"""`lineage bench agents`: one agent traffic against every cache policy, beside the oracle.

In one run, the same seeded traffic (clients.bench.traffic) goes to
- the real server and model in `lineage`, `exact` and `off` cache modes: three
  engines started in this process one after the other, each with a fresh
  cache directory, driven through `Client` with one thread per lane;
- mlx-lm's own server prompt cache (`LRUPromptCache`, same model, same byte
  budget), driven as mlx_lm.server's batch path drives it: fetch_nearest_cache
  at admission, the system segment stored when its prefill ends, the rest
  prefilled, greedy decode, insert_cache of prompt + completion;
- a real `mlx_lm.server` subprocess on the same model directory
  (clients.bench.peer), fed the same messages and tools through its OpenAI
  HTTP API, one thread per lane (a dropped stream hangs up after its drop
  point, as ours is cancelled there);
- the oracle: for each request, the longest prefix its prompt shares with the
  prompt of any request of an earlier step, or with prompt + completion of
  any earlier completed one (capped at the prompt length minus 1).

Requests of one step run concurrently; a step starts when the previous one has
ended, so "earlier" is the same for every policy. Replies are appended to the
conversations as each policy's model produced them, so each policy has its own
oracle; they coincide when the replies do. Prompt ids are rendered and
tokenized here exactly as the front end does, and checked against the
engine's `usage.prompt_tokens`.

Cheap to import: MLX, mlx-lm, Ray and matplotlib are imported inside the functions.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from clients.bench.traffic import Sessions, Traffic, build_traffic
from engine.cache.tokens import common_prefix

HELP = "agent traffic against lineage, exact, off and mlx-lm's prompt cache, beside the oracle"
POLICIES = ("lineage", "exact", "off", "mlx_lm", "mlx_lm_server")
MLX_LM_ENTRIES = 10  # mlx_lm.server --prompt-cache-size default


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


@dataclass
class Observed:
    """One request as a policy served it."""

    rid: int
    step: int
    lane: int
    kind: str
    prompt: np.ndarray  # prompt token ids
    completion: list  # ids received (all of them, or up to the drop)
    completed: bool
    cached: int = 0
    restore: str = "none"
    restore_length: int = 0
    ttft_ms: float = 0.0

    @property
    def stored(self) -> np.ndarray:
        """What a later request may share: prompt + completion once the reply completed."""
        if not self.completed:
            return self.prompt
        return np.concatenate([self.prompt, np.asarray(self.completion, dtype=self.prompt.dtype)])


@dataclass
class PolicyRun:
    name: str
    observed: list = field(default_factory=list)
    stats: list = field(default_factory=list)  # cache figures after each step
    evictions: int = 0
    wall_s: float = 0.0
    replicas: dict = field(default_factory=dict)  # several replicas: clients.bench.replicas


# ------------------------------------------------------------------ oracle ----


def oracle_lengths(steps, prompts, stored) -> list[int]:
    """Per request, the longest prefix shared with `stored` of any request of an earlier step.

    `stored[j]` is request j's prompt, plus its completion if it completed.
    Capped at the prompt length minus 1 (one token must be computed).
    """
    out = []
    for i, prompt in enumerate(prompts):
        best = max(
            (common_prefix(prompt, stored[j]) for j in range(len(prompts)) if steps[j] < steps[i]),
            default=0,
        )
        out.append(max(0, min(best, len(prompt) - 1)))
    return out


# -------------------------------------------------------------- prompt ids ----


class PromptIds:
    """The front end's rendering and tokenization, in this process."""

    def __init__(self, model_path: str):
        from pathlib import Path

        from mlx_lm.utils import load_tokenizer

        from engine.server.prompt import PromptBuilder

        self.tokenizer = load_tokenizer(Path(model_path))
        self.builder = PromptBuilder(self.tokenizer, 1 << 30, 1 << 30)

    def encode(self, messages: list, tools) -> np.ndarray:
        """Prompt ids as the server builds them (through the wire format)."""
        from clients.client import build_request
        from engine.server.service import to_prompt_input

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
    from engine.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig
    from engine.server.background import BackgroundEngine

    config = EngineConfig(
        model=ModelConfig(path=opts.model, prefill_step_size=opts.prefill_step_size),
        cache=CacheConfig(mode=mode, ram_budget=opts.ram_budget, cache_dir=cache_dir),
        server=ServerConfig(
            port=0,
            replicas=replicas,
            route_threshold=opts.route_threshold,
            ray_namespace=f"lineage-bench-{mode}-{replicas}",
        ),
    )
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
                yield ob, text

        def sample():
            s = client.cache_stats()
            return {
                "ram_bytes": s["ram_bytes"],
                "disk_bytes": s["disk_bytes"],
                "evictions": s["evictions"],
                "disk_bytes_written": s.get("disk_bytes_written", files.written()),
            }

        run = _drive(mode, traffic, ids, serve, sample)
        if replicas > 1:
            from clients.bench.replicas import replica_figures

            run.name = f"{mode}_x{replicas}"
            run.replicas = replica_figures(engine, client, run.observed)
        return run


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


def _drive(name: str, traffic: Traffic, ids: PromptIds, serve, sample) -> PolicyRun:
    """Run the traffic step by step: `serve(batch)` yields (Observed, reply text) per request
    of the step, in order; `sample()` gives the cache figures after each step."""
    out = PolicyRun(name)
    sessions = Sessions(traffic)
    t0 = time.perf_counter()
    for step in traffic.steps():
        batch = []
        for spec in step:
            messages = sessions.messages(spec)
            batch.append((spec, messages, ids.encode(messages, traffic.tools)))
        for (spec, messages, _), (ob, text) in zip(batch, serve(batch)):
            sessions.record(spec, messages, text, ob.completed)
            out.observed.append(ob)
        out.stats.append(sample())
    out.wall_s = time.perf_counter() - t0
    out.evictions = out.stats[-1]["evictions"] if out.stats else 0
    return out


# ------------------------------------------------------------------ mlx-lm ----


def run_mlx_lm_server(traffic: Traffic, opts: BenchOptions, ids: PromptIds) -> PolicyRun:
    """The traffic against a real mlx_lm.server subprocess, concurrently per step."""
    from concurrent.futures import ThreadPoolExecutor

    from clients.bench.peer import MlxLmServer

    with (
        MlxLmServer(opts.model) as server,
        ThreadPoolExecutor(max(1, traffic.agents)) as pool,
    ):

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

        return _drive("mlx_lm_server", traffic, ids, serve, sample)


def run_mlx_lm(traffic: Traffic, opts: BenchOptions, ids: PromptIds) -> PolicyRun:
    """The traffic against mlx-lm's LRUPromptCache, in this process, as its server drives it.

    Per step: every request fetches at admission (the batch server admits
    them together), then each is served in turn: the system segment is
    prefilled and stored ("system") when the prompt has one and the fetch did
    not cover it, the rest is prefilled, the reply decoded greedily, and the
    cache inserted under the tokens it holds (prompt + completion minus the
    last, unfed token). A dropped stream stores nothing more (the server
    removes it without its cache). An exact hit leaves no token to compute;
    the batch server would refuse it, so it is served cold.
    """
    import copy

    import mlx_lm
    from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache

    model, tokenizer = mlx_lm.load(opts.model)
    eos = {int(t) for t in tokenizer.eos_token_ids}
    lru = LRUPromptCache(max_size=MLX_LM_ENTRIES, max_bytes=opts.ram_budget)
    evictions = [0]
    pop = lru._lru.pop

    def counted_pop():  # CacheOrder.pop runs for evictions only
        evictions[0] += 1
        return pop()

    lru._lru.pop = counted_pop
    key = (opts.model, None, None)

    def serve(batch):
        admitted = []
        for _spec, _messages, prompt in batch:
            t = time.perf_counter()
            kind = _mlx_lm_kind(lru, key, prompt.tolist())
            cache, rest = lru.fetch_nearest_cache(key, prompt.tolist())
            if cache is None or not rest:
                cache, rest, kind = make_prompt_cache(model), prompt.tolist(), "none"
            admitted.append((cache, rest, kind, time.perf_counter() - t))
        for (spec, messages, prompt), (cache, rest, kind, fetch_s) in zip(batch, admitted):
            t = time.perf_counter()
            cached = len(prompt) - len(rest)
            end = ids.system_end(messages, traffic.tools, prompt)
            if cached < end:
                _prefill(model, cache, prompt[cached:end].tolist(), opts.prefill_step_size)
                lru.insert_cache(
                    key, prompt[:end].tolist(), copy.deepcopy(cache), cache_type="system"
                )
                rest = prompt[end:].tolist()
            limit = spec.drop_after or spec.max_tokens
            got, first_at = _decode(model, cache, rest, limit, eos, opts.prefill_step_size)
            done = not spec.drop_after or got[-1] in eos
            if done:
                lru.insert_cache(key, prompt.tolist() + got[:-1], cache, cache_type="assistant")
            reply = [g for g in got if g not in eos]
            yield (
                Observed(
                    spec.rid,
                    spec.step,
                    spec.lane,
                    spec.kind,
                    prompt,
                    reply,
                    done,
                    cached,
                    kind,
                    cached,
                    (fetch_s + first_at - t) * 1000,
                ),
                tokenizer.decode(reply),
            )

    def sample():
        return {
            "ram_bytes": lru.nbytes,
            "disk_bytes": 0,
            "disk_bytes_written": 0,
            "evictions": evictions[0],
        }

    return _drive("mlx_lm", traffic, ids, serve, sample)


def _mlx_lm_kind(lru, key, tokens: list) -> str:
    """Which stored key fetch_nearest_cache will use, by its trie search and cache type."""
    from mlx_lm.models.cache import can_trim_prompt_cache

    found = lru._trie.search(key, tokens)
    if found.exact is not None:
        return "exact"
    short = len(found.shorter) if found.shorter is not None else 0
    longer = found.longer is not None and found.common_prefix > short
    if longer and can_trim_prompt_cache(lru._trie.get(found.model, found.longer).prompt_cache):
        return "longer"
    if short:
        return "shorter:" + lru._trie.get(found.model, found.shorter).cache_type
    return "none"


def _prefill(model, cache, tokens: list, step: int) -> None:
    import mlx.core as mx

    for i in range(0, len(tokens), step):
        model(mx.array(tokens[i : i + step])[None], cache=cache)
        mx.eval([c.state for c in cache])


def _decode(model, cache, rest: list, limit: int, eos: set, step: int):
    """Prefill `rest` and decode greedily: (ids, perf_counter time of the first token)."""
    import mlx.core as mx

    _prefill(model, cache, rest[:-1], step)
    y, got, first = rest[-1], [], 0.0
    for _ in range(limit):
        y = int(mx.argmax(model(mx.array([[y]]), cache=cache)[0, -1]).item())
        if not got:
            first = time.perf_counter()
        got.append(y)
        if y in eos:
            break
    return got, first


# --------------------------------------------------------------------- run ----


def run_bench(opts: BenchOptions) -> dict:
    """Every policy on the same traffic; the report (JSON-ready). Ray must be initialized
    when an engine policy is asked for."""
    import shutil

    from clients.bench.replicas import parse

    unknown = [p for p in opts.policies if p not in POLICIES and not parse(p)]
    if unknown:
        raise ValueError(f"unknown policies {unknown} (use some of {', '.join(POLICIES)})")
    traffic = build_traffic(opts.seed, opts.scale, opts.agents, opts.variants)
    ids = PromptIds(opts.model)
    runs = {}
    work = tempfile.mkdtemp(prefix="lineage-bench-agents-", dir=opts.work_dir)
    try:
        for name in opts.policies:
            if name == "mlx_lm":
                runs[name] = run_mlx_lm(traffic, opts, ids)
            elif name == "mlx_lm_server":
                runs[name] = run_mlx_lm_server(traffic, opts, ids)
            else:
                mode, count = parse(name) or (name, 1)
                path = os.path.join(work, name)
                runs[name] = run_engine(mode, traffic, opts, ids, path, count)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from clients.bench.report import summarize

    phases = {r.rid: r.phase for r in traffic.requests if r.phase}
    policies = {name: summarize(run, phases) for name, run in runs.items()}
    first = next(iter(policies.values()))
    replies = {
        name: {o.rid: o.completion for o in run.observed if o.completed}
        for name, run in runs.items()
    }
    base = next(iter(replies.values()))
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
        default=",".join(POLICIES),
        help=f"comma-separated subset of {','.join(POLICIES)}",
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
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write the figure (matplotlib)")


def options_from_args(args) -> BenchOptions:
    """BenchOptions of the parsed flags; builds the embedded model when --model is absent."""
    from engine.config import EngineConfig, parse_bytes

    model = args.model
    if not model:
        from engine.runtime.tiny_models import ensure_default_model

        model = str(ensure_default_model())
    budget = (
        parse_bytes(args.ram_budget)
        if args.ram_budget
        else EngineConfig.from_sources({}, {}).cache.ram_budget
    )
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    replicas = getattr(args, "replicas", 1) or 1
    if replicas > 1 and args.policies == ",".join(POLICIES):  # --policies not given
        policies = ("lineage", f"lineage_x{replicas}")
    return BenchOptions(
        model=model,
        scale=args.scale,
        agents=args.agents,
        seed=args.seed,
        ram_budget=budget,
        policies=policies,
        replicas=replicas,
        route_threshold=getattr(args, "route_threshold", 4096),
        variants=getattr(args, "variants", 4),
    )


def run(args) -> int:
    """`lineage bench agents`: print the table; write --json and --plot when asked."""
    from clients.bench import emit, own_ray
    from clients.bench.report import format_table, plot

    opts = options_from_args(args)
    with own_ray(needed=any(p not in ("mlx_lm", "mlx_lm_server") for p in opts.policies)):
        report = run_bench(opts)
    return emit(report, args, format_table, plot)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="lineage bench agents", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
