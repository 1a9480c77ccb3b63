"""`lineage bench concurrency`: concurrent sub-agents per prefill schedule, and MLX peers.

One seeded agent traffic (clients.bench.agents.traffic: K lanes sharing a system
prompt plus tools, tool results of varied size) runs step by step; in every
`--cold-every`-th step a long cold prompt (a system prompt of its own) is
sent first and the lanes' warm turns follow `--stagger-ms` later, so they
arrive while it prefills. Replies are greedy, so every schedule sees the same
conversations. With `--traffic trace`, Mooncake's conversation trace instead,
scaled and open loop (clients.bench.concurrency.trace). The traffic runs
- once with every request alone (`solo`): each request's time to first token
  on an idle engine from the same cache state;
- once per schedule (`--runs`), each on a fresh engine (`srpt-unbounded`:
  srpt without the wait bound, `--prefill-wait-bound 0`; `srpt-chunkN`: srpt
  with `--prefill-chunk-max N`; `srpt-nowait`: no wait for a request in flight,
  `--flight-wait 0`; `srpt-wide`: a long prompt nobody else waits for in fewer, longer
  chunks, `--prefill-growth 25 --prefill-chunk-max 1024`; `srpt-boundX`: srpt with
  `--prefill-wait-bound X`);
- once against each peer server, a subprocess on the same model directory
  (`mlx_lm_server`, `mlx_vlm`, `rapid_mlx`: clients.bench.peers, each from a
  venv of its own, `--install-peers` makes them; one that cannot run here is
  skipped with its reason), fed through its OpenAI API from one thread per lane.
With `--rounds R` the runs go R times in turn (peer, ours, peer, ours), the
probes in the first round only; the table adds each headline figure's median
and spread over the rounds. Beside TTFT: cold prompts' prefill rate (prompt
tokens per second of TTFT, prompts over 800 tokens) and the worst TTFT by
prompt length (report).
A dropped call of the traffic is cancelled mid-stream after its drop point
(ours: the gRPC call is cancelled; the peer: the HTTP connection is closed),
and its retry resends the same messages in the next step.

After the traffic, a probe on each schedule's engine: a short warm turn (200
new tokens) arrives while an 8k-token cold prompt prefills, its time to first
token divided by the same turn's on the idle engine; then streams decode back
to back while another 8k-token cold prompt prefills, their inter-token gaps
over the whole prefill divided by the idle decode step, beside the model
loop's own steps in that window split by phase (engine.runtime.batching.step_profile:
what the slowest gaps are made of) and that prompt's time to first token
against the same prompt alone.

Times are the client's (send to first chunk), for ours and the peer alike.
Cheap to import: MLX, Ray and matplotlib load inside functions.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from clients.bench.agents.traffic import Sessions, Traffic, build_traffic
from clients.bench.concurrency.forward_costs import floor_probe, grouping_probe
from clients.bench.concurrency.report import HEADLINE, format_table, plot, summarize
from clients.bench.concurrency.senders import PEER_RUNS, EngineSender, PeerSender, Sent  # noqa: F401
from clients.bench.concurrency.time_split import time_split
from clients.bench.figures import emit, percentile, plot_ready
from clients.bench.harness import model_path, own_ray
from clients.fanout import make_system_prompt
from engine.config import PREFILL_EVALS, ModelConfig

HELP = "concurrent sub-agents plus long cold prompts: TTFT, ITL and prefill rate per schedule"
RUNS = ("batched", "fifo", "srpt", "srpt-group", "mlx_lm_server", "mlx_vlm", "rapid_mlx")
# Asked by name only; and srpt-chunkN (--prefill-chunk-max N), srpt-boundX (--prefill-wait-bound X).
EXTRA_RUNS = ("srpt-unbounded", "srpt-nowait", "srpt-wide")
# srpt-wide: a long prompt nobody else waits for in fewer, longer chunks (WIDE: the engines'
# --prefill-growth, as its fixed share, and --prefill-chunk-max).
WIDE = (0.04, 1024)


def _chunk_run(name: str) -> bool:
    return name.startswith("srpt-chunk") and name[len("srpt-chunk") :].isdigit()


def _bound_run(name: str) -> float | None:
    """X of `srpt-boundX` where X is a wait bound the engine takes (its own check, ModelConfig)."""
    if not name.startswith("srpt-bound"):
        return None
    try:
        return ModelConfig(prefill_wait_bound=float(name[len("srpt-bound") :])).prefill_wait_bound
    except ValueError:
        return None


PROBE_SHORT = 200  # new tokens of the probe's warm turn


@dataclass(frozen=True)
class ConcurrencyOptions:
    model: str
    scale: float = 0.25
    agents: int = 3
    seed: int = 0
    runs: tuple = RUNS
    cold_every: int = 2
    cold_tokens: int = 0  # 0: the traffic's prefix size
    stagger_ms: float = 150.0
    probe_tokens: int = 8192
    probes: tuple | None = None  # runs probed after their traffic; None: every engine run
    prefill_budget: int = 256  # the engine's default
    prefill_step_size: int = 512
    step_factor: float = ModelConfig.prefill_step_factor  # the engine's defaults
    slice_ms: float = ModelConfig.prefill_slice_ms
    overlap: bool = ModelConfig.prefill_overlap
    prefill_eval: str = ModelConfig.prefill_eval
    wait_bound: float = ModelConfig.prefill_wait_bound
    chunk_max: int | None = ModelConfig.prefill_chunk_max
    rounds: int = 1
    install_peers: bool = False
    work_dir: str | None = None
    traffic: str = "agents"  # agents | trace (clients.bench.concurrency.trace)
    trace_requests: int = 60
    trace_scale: float = 0.05
    trace_span_s: float = 60.0
    trace_max_tokens: int = 32
    trace_every: int = 100


# ---------------------------------------------------------------- traffic ----


def cold_messages(opts: ConcurrencyOptions, traffic: Traffic, step: int) -> list:
    size = opts.cold_tokens or int(len(traffic.systems["main"]) / 4)
    system = make_system_prompt(size, seed=10_000 + step + 1000 * opts.seed)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Summarize the rules above (batch {step})."},
    ]


def drive(sender, traffic, opts: ConcurrencyOptions, solo: bool) -> list[Sent]:
    """The traffic step by step; concurrent within a step unless `solo` (the trace: its
    own replay)."""
    if not isinstance(traffic, Traffic):
        return traffic.drive(sender, solo)
    sessions = Sessions(traffic)
    out: list[Sent] = []
    with ThreadPoolExecutor(traffic.agents + 1) as pool:
        for n, step in enumerate(traffic.steps()):
            batch = [(spec, sessions.messages(spec)) for spec in step]
            jobs = []
            if opts.cold_every and n % opts.cold_every == opts.cold_every - 1:
                cold = cold_messages(opts, traffic, n)
                jobs.append(dict(key=f"cold{n}", kind="cold", messages=cold, max_tokens=8))
            jobs += [
                dict(
                    key=f"r{spec.rid}",
                    kind="warm",
                    messages=messages,
                    tools=traffic.tools,
                    max_tokens=spec.max_tokens,
                    drop_after=spec.drop_after,
                )
                for spec, messages in batch
            ]
            if solo:
                results = [sender.send(**job) for job in jobs]
            else:
                futures = []
                for i, job in enumerate(jobs):
                    if i == 1 and jobs[0]["kind"] == "cold":
                        time.sleep(opts.stagger_ms / 1000)  # the warm turns come during it
                    futures.append(pool.submit(sender.send, **job))
                results = [f.result() for f in futures]
            out += results
            by_key = {s.key: s for s in results}
            for spec, messages in batch:
                got = by_key[f"r{spec.rid}"]
                sessions.record(spec, messages, got.text, got.completed)
    return out


# ------------------------------------------------------------------ probe ----


def probe(sender, opts: ConcurrencyOptions) -> dict:
    """Short warm turn and decode gaps during an 8k cold prefill, against the idle engine."""
    rng = random.Random(opts.seed)

    def ids(n):
        return [rng.randrange(20, 4000) for _ in range(n)]

    short, solo_cold = _short_turn_probe(sender, opts, ids)
    # The idle step right before the window, as the same streams see it: the median gap.
    t_idle = time.perf_counter()
    idle = sender.send("idle", "warm", prompt_ids=ids(40), max_tokens=300)
    idle_step = percentile(_gaps(idle.chunk_times), 50)
    cold, streams = _decode_beside_cold(sender, opts, ids)
    t_cold_first = cold.t_first or cold.t_end
    window = [
        b - a
        for stream in streams
        for a, b in zip(stream.chunk_times, stream.chunk_times[1:])
        if a >= cold.t_send and b <= t_cold_first
    ]
    p99 = percentile(window, 99)
    out = {
        "idle_step_ms": idle_step * 1000,
        "itl_during_8k_prefill_ms_p50": percentile(window, 50) * 1000,
        "itl_during_8k_prefill_ms_p99": p99 * 1000,
        "itl_p99_over_idle_step": p99 / idle_step if idle_step else 0.0,
        "gaps_in_window": len(window),
        **short,
        "cold_8k_ttft_ms": cold.ttft_ms,
        "cold_8k_solo_ttft_ms": solo_cold.ttft_ms,
        "streams": [  # seconds from the cold prompt's send; tokens streamed
            (
                round(q.t_send - cold.t_send, 3),
                round((q.t_first or q.t_end) - cold.t_send, 3),
                round(q.t_end - cold.t_send, 3),
                len(q.chunk_times),
            )
            for q in streams
        ],
    }
    if hasattr(sender, "step_profile"):  # the model loop's own steps in the same window
        out["loop_steps_during_8k_prefill"] = sender.step_profile(cold.t_send, t_cold_first)
        out["loop_steps_idle"] = sender.step_profile(t_idle, idle.t_end)
    return out


def _short_turn_probe(sender, opts: ConcurrencyOptions, ids) -> tuple[dict, Sent]:
    """A short warm turn's TTFT while an 8k cold prompt prefills, against the same turn's on
    the idle engine: its figures; then an 8k cold prompt alone: its Sent."""
    turns = {}
    for name in ("solo", "busy"):  # two conversations of the same shape
        base = ids(600)
        sender.send(f"{name}-base", "warm", prompt_ids=base, max_tokens=1)
        turns[name] = base + ids(PROBE_SHORT)
    solo = sender.send("solo-turn", "warm", prompt_ids=turns["solo"], max_tokens=1)
    with ThreadPoolExecutor(2) as pool:  # a short warm turn during an 8k cold prefill
        first = pool.submit(sender.send, "8k-a", "cold", None, None, ids(opts.probe_tokens), 1)
        time.sleep(0.3)
        busy = sender.send("busy-turn", "warm", prompt_ids=turns["busy"], max_tokens=1)
        first.result()
    solo_cold = sender.send("8k-solo", "cold", prompt_ids=ids(opts.probe_tokens), max_tokens=1)
    return {
        "short_turn_uncached": PROBE_SHORT,
        "short_turn_ttft_ms": busy.ttft_ms,
        "short_turn_solo_ttft_ms": solo.ttft_ms,
        "short_turn_over_solo": busy.ttft_ms / solo.ttft_ms if solo.ttft_ms else 0.0,
    }, solo_cold


def _decode_beside_cold(sender, opts: ConcurrencyOptions, ids) -> tuple:
    """Streams decoding back to back while an 8k cold prompt prefills: (the cold prompt's
    Sent, the streams' Sents)."""
    stop = threading.Event()
    streams: list = []
    prompts = [ids(40) for _ in range(64)]

    def keep_decoding() -> None:  # streams back to back, through the whole cold prefill
        for prompt in prompts:
            if stop.is_set():
                return
            streams.append(sender.send("stream", "warm", prompt_ids=prompt, max_tokens=300))

    with ThreadPoolExecutor(1) as pool:  # decoding streams during an 8k cold prefill
        decoding = pool.submit(keep_decoding)
        time.sleep(0.5)
        cold = sender.send("8k-b", "cold", prompt_ids=ids(opts.probe_tokens), max_tokens=1)
        stop.set()
        decoding.result()
    return cold, streams


def _gaps(times: list) -> list:
    return [b - a for a, b in zip(times, times[1:])] or [0.0]


# -------------------------------------------------------------------- run ----


def run_bench(opts: ConcurrencyOptions) -> dict:
    """Solo pass, every run, the probes; the report (JSON-ready). Ray must be initialized."""
    import shutil

    named = RUNS + EXTRA_RUNS
    unknown = [
        r for r in opts.runs if r not in named and not _chunk_run(r) and _bound_run(r) is None
    ]
    if unknown:
        raise ValueError(
            f"unknown runs {unknown} (use some of {', '.join(named)}, srpt-chunkN, srpt-boundX)"
        )
    if opts.traffic == "trace":
        from clients.bench.concurrency.trace import TraceTraffic

        traffic = TraceTraffic(
            opts.seed, opts.trace_requests, opts.trace_scale, opts.trace_span_s,
            opts.trace_max_tokens, opts.trace_every,
        )  # fmt: skip
    else:
        traffic = build_traffic(opts.seed, opts.scale, opts.agents)
    work = tempfile.mkdtemp(prefix="lineage-bench-concurrency-", dir=opts.work_dir)
    results: dict = {}
    load = os.getloadavg()
    if opts.install_peers:
        from clients.bench.peers import install

        for name in set(opts.runs) & set(PEER_RUNS):
            install(PEER_RUNS[name])
    try:
        sender = EngineSender(opts, "srpt", 1, os.path.join(work, "solo"))
        try:
            solo = drive(sender, traffic, opts, solo=True)
        finally:
            sender.close()
        for round_ in range(max(1, opts.rounds)):
            for name in opts.runs:
                summary = _one_run(opts, traffic, solo, name, work, probed=round_ == 0)
                if round_ == 0:
                    results[name] = summary
                if "skipped" not in summary:
                    results[name].setdefault("rounds", []).append({k: summary[k] for k in HEADLINE})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "traffic": traffic.summary(),
        "model": opts.model,
        "grouping_probe": grouping_probe(opts.model),
        "floor_probe": floor_probe(opts.model),
        "options": {
            k: getattr(opts, k)
            for k in ("scale", "agents", "cold_every", "stagger_ms", "probe_tokens")
        }
        | {"prefill_budget": opts.prefill_budget, "prefill_step_size": opts.prefill_step_size}
        | {"step_factor": opts.step_factor, "slice_ms": opts.slice_ms, "overlap": opts.overlap}
        | {"prefill_eval": opts.prefill_eval, "wait_bound": opts.wait_bound}
        | {"chunk_max": opts.chunk_max},
        "runs": results,
        "load_average": [load, os.getloadavg()],
    }


def _one_run(opts, traffic, solo, name: str, work: str, probed: bool) -> dict:
    """One run of the traffic on a fresh engine or peer: its summary, or why it was skipped."""
    if name in PEER_RUNS:
        sender = PeerSender(opts, name)
        if sender.reason:
            print(f"{name}: skipped: {sender.reason}", flush=True)
            return {"skipped": sender.reason}
    else:
        schedule, _, variant = name.partition("-")
        group = opts.agents + 1 if variant == "group" else 1
        bound = 0.0 if variant == "unbounded" else _bound_run(name)
        chunk = int(variant[len("chunk") :]) if variant.startswith("chunk") else None
        share = WIDE[0] if variant == "wide" else None
        chunk = WIDE[1] if variant == "wide" else chunk
        directory = os.path.join(work, f"{name}-{time.monotonic_ns()}")
        sender = EngineSender(
            opts, schedule, group, directory, wait_bound=bound, chunk_max=chunk,
            flight_wait=0.0 if variant == "nowait" else None, fixed_share=share,
        )  # fmt: skip
    try:
        t0 = time.perf_counter()
        sent = drive(sender, traffic, opts, solo=False)
        split = None
        if hasattr(sender, "prefill_log"):  # where the traffic's prefill time went
            split = time_split(sender.prefill_log(t0, time.perf_counter()), sent)
        probe_figures = None
        if probed and name not in PEER_RUNS and (opts.probes is None or name in opts.probes):
            probe_figures = probe(sender, opts)
    finally:
        sender.close()
    return summarize(sent, solo, probe_figures) | ({"time_split": split} if split else {})


def add_arguments(parser) -> None:
    parser.add_argument("--agents", type=int, default=3, help="concurrent sub-agents (lanes)")
    parser.add_argument(
        "--scale", type=float, default=0.25, help="traffic size (1.0: ~10k-token system prompt)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", metavar="PATH", help="model directory (default: tiny model)")
    parser.add_argument(
        "--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)}"
    )
    parser.add_argument("--cold-every", type=int, default=2, help="a cold prompt every N steps")
    parser.add_argument("--stagger-ms", type=float, default=150.0)
    parser.add_argument("--probe-tokens", type=int, default=8192)
    parser.add_argument(
        "--probes", metavar="RUNS", help="comma-separated runs to probe (default: every engine run)"
    )
    parser.add_argument("--prefill-budget", type=int, default=256)
    parser.add_argument(
        "--step-factor",
        type=float,
        default=ModelConfig.prefill_step_factor,
        help="the engines' --prefill-step-factor",
    )
    parser.add_argument(
        "--slice-ms",
        type=float,
        default=ModelConfig.prefill_slice_ms,
        help="the engines' --prefill-slice-ms",
    )
    parser.add_argument(
        "--overlap",
        choices=("on", "off"),
        default="on" if ModelConfig.prefill_overlap else "off",
        help="the engines' --prefill-overlap",
    )
    parser.add_argument(
        "--prefill-eval",
        choices=PREFILL_EVALS,
        default=ModelConfig.prefill_eval,
        help="the engines' --prefill-eval",
    )
    parser.add_argument(
        "--wait-bound",
        type=float,
        default=ModelConfig.prefill_wait_bound,
        help="the engines' --prefill-wait-bound (srpt-unbounded: 0)",
    )
    parser.add_argument(
        "--chunk-max", type=int, default=None, help="the engines' --prefill-chunk-max"
    )
    parser.add_argument("--rounds", type=int, default=1, help="the runs R times, interleaved")
    parser.add_argument(
        "--install-peers", action="store_true", help="make the peers' venvs first (pip)"
    )
    parser.add_argument(
        "--traffic",
        choices=("agents", "trace"),
        default="agents",
        help="agents: the sub-agent lanes; trace: Mooncake's conversation trace, scaled, open "
        "loop (clients.bench.concurrency.trace)",
    )
    parser.add_argument("--trace-requests", type=int, default=60, help="trace: the first N")
    parser.add_argument(
        "--trace-every", type=int, default=100, help="trace: one conversation in N, every turn"
    )
    parser.add_argument(
        "--trace-scale", type=float, default=0.05, help="trace: token counts times X"
    )
    parser.add_argument(
        "--trace-span", type=float, default=60.0, help="trace: arrivals squeezed into S seconds"
    )
    parser.add_argument(
        "--trace-max-tokens", type=int, default=32, help="trace: a reply's tokens at most"
    )
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write the figure (matplotlib)")


def run(args) -> int:
    """`lineage bench concurrency`: print the table; write --json and --plot when asked."""
    if not plot_ready(args, "lineage bench concurrency"):
        return 1
    opts = ConcurrencyOptions(
        model=model_path(args.model),
        scale=args.scale,
        agents=args.agents,
        seed=args.seed,
        runs=tuple(r.strip() for r in args.runs.split(",") if r.strip()),
        cold_every=args.cold_every,
        stagger_ms=args.stagger_ms,
        probe_tokens=args.probe_tokens,
        probes=tuple(r.strip() for r in args.probes.split(",")) if args.probes else None,
        prefill_budget=args.prefill_budget,
        step_factor=args.step_factor,
        slice_ms=args.slice_ms,
        overlap=args.overlap == "on",
        prefill_eval=args.prefill_eval,
        wait_bound=args.wait_bound,
        chunk_max=args.chunk_max if args.chunk_max is not None else ModelConfig.prefill_chunk_max,
        rounds=args.rounds,
        install_peers=args.install_peers,
        traffic=args.traffic,
        trace_requests=args.trace_requests,
        trace_scale=args.trace_scale,
        trace_span_s=args.trace_span,
        trace_max_tokens=args.trace_max_tokens,
        trace_every=args.trace_every,
    )
    with own_ray():
        report = run_bench(opts)
    return emit(report, args, format_table, plot)
