"""`lineage bench simulate`: our prefill policy against FCFS whole prefill, on a Mac's costs.

Where we cannot run (a Mac, GLM-5.3-Flash), the policy's choices are shown by
simulation: the engine's own PrefillScheduler, driven step by step by a cost
model (clients.bench.simulate.costs: prefill tokens/s, a forward's fixed part,
a decode step, defaults from a published M3 Ultra account), against first
come, first served with every prompt prefilled whole while the streams wait
(what mlx-vlm's server does), on the benchmarks' own traffic
(clients.bench.simulate.traffic): Mooncake's conversation trace scaled, and
`bench concurrency`'s sub-agent lanes with cold prompts; ours with the
engine's defaults (and with `--chunk-max N`, also with --prefill-chunk-max N). Figures: TTFT p50 and
p90, cold prompts' tokens per second of TTFT (prompts over 800 tokens, nine
tenths or more uncached), decode gaps (p99 of all, and of the gaps that had a
prefill inside them), the share of prompt tokens restored, the replay's length.

Pure Python: no MLX, no Ray, no clock (clients.bench.simulate.engine).
"""

from __future__ import annotations

from dataclasses import fields, replace

from clients.bench.figures import emit, markdown_table, percentile
from clients.bench.simulate.costs import MachineCosts
from engine.config import ModelConfig

HELP = "our prefill policy against FCFS whole prefill (mlx-vlm's), simulated on a Mac's costs"
COLD_MIN = 800
POLICIES = ("ours", "fcfs")
RATIOS = ("ttft_ms_p50", "ttft_ms_p90", "cold_tok_per_s_p50", "gap_ms_p99_beside_prefill")


def summarize(loop) -> dict:
    done = loop.done
    ttft = [s.first_ms - s.arrived_ms for s in done]
    colds = [
        s
        for s in done
        if s.req.tokens > COLD_MIN and s.cached <= 0.1 * s.req.tokens and s.first_ms > s.arrived_ms
    ]
    rates = [s.req.tokens / ((s.first_ms - s.arrived_ms) / 1000) for s in colds]
    gaps = [g for s in done for g, _ in s.gaps]
    beside = [g for s in done for g, b in s.gaps if b]
    prompt = sum(s.req.tokens for s in done)
    return {
        "requests": len(done),
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p90": percentile(ttft, 90),
        "cold_prompts": len(colds),
        "cold_tok_per_s_p50": percentile(rates, 50),
        "gap_ms_p99": percentile(gaps, 99),
        "gap_ms_p99_beside_prefill": percentile(beside, 99),
        "cached_share": sum(s.cached for s in done) / prompt if prompt else 0.0,
        "replay_s": max((s.done_ms or 0.0) for s in done) / 1000 if done else 0.0,
    }


def run_bench(args) -> dict:
    from clients.bench.simulate.engine import run_fcfs, run_ours
    from clients.bench.simulate.traffic import agent_requests, trace_requests

    costs = MachineCosts(**{f.name: getattr(args, f.name) for f in fields(MachineCosts)})
    traffics = {
        "agents": (agent_requests(args.seed, args.scale, args.agents, args.cold_every), True),
        "trace": (
            trace_requests(
                args.seed, args.trace_requests, args.trace_scale, costs.prefill_tok_s, args.load
            ),
            False,
        ),
    }
    out = {}
    for name, (requests, closed) in traffics.items():
        model = ModelConfig(max_batch=args.max_batch, prefill_wait_bound=args.wait_bound)
        runs = {
            "ours": summarize(run_ours(requests, costs, closed, model)),
            "fcfs": summarize(run_fcfs(requests, costs, closed, args.prefill_step, args.max_batch)),
        }
        if args.chunk_max:
            big = replace(model, prefill_chunk_max=args.chunk_max)
            runs[f"ours_chunk{args.chunk_max}"] = summarize(run_ours(requests, costs, closed, big))
        ours, fcfs = runs["ours"], runs["fcfs"]
        runs["ours_over_fcfs"] = {
            k: ours[k] / fcfs[k] if fcfs[k] else 0.0
            for k in (
                "ttft_ms_p50",
                "ttft_ms_p90",
                "cold_tok_per_s_p50",
                "gap_ms_p99_beside_prefill",
            )
        }
        out[name] = runs
    return {"costs": costs.__dict__, "traffic": out}


def format_table(report: dict) -> str:
    header = ("traffic", "policy", "n", "TTFT p50 s", "TTFT p90 s", "cold tok/s (n)")
    header += ("gap p99 ms (beside prefill)", "restored", "replay s")
    rows = []
    for name, runs in report["traffic"].items():
        for policy in [p for p in runs if p != "ours_over_fcfs"]:
            r = runs[policy]
            rows.append(
                [
                    name,
                    policy,
                    str(r["requests"]),
                    f"{r['ttft_ms_p50'] / 1000:.2f}",
                    f"{r['ttft_ms_p90'] / 1000:.2f}",
                    f"{r['cold_tok_per_s_p50']:.0f} ({r['cold_prompts']})",
                    f"{r['gap_ms_p99']:.0f} ({r['gap_ms_p99_beside_prefill']:.0f})",
                    f"{r['cached_share']:.2f}",
                    f"{r['replay_s']:.0f}",
                ]
            )
    c = report["costs"]
    lines = [
        f"costs: prefill {c['prefill_tok_s']:.0f} tok/s + {c['chunk_fixed_ms']:.0f} ms a forward, "
        f"decode step {c['decode_ms']:.0f} ms (+{c['decode_extra_ms']:.0f} a sequence), state "
        f"{c['state_mb']:.0f} MB, KV {c['kv_kb_per_token']:.0f} KB/token",
        "",
        *markdown_table(header, rows),
        "",
    ]
    for name, runs in report["traffic"].items():
        v = runs["ours_over_fcfs"]
        lines.append(
            f"{name}: ours over fcfs: TTFT p50 {v['ttft_ms_p50']:.2f}x, p90 "
            f"{v['ttft_ms_p90']:.2f}x, cold tok/s {v['cold_tok_per_s_p50']:.2f}x, gaps beside a "
            f"prefill p99 {v['gap_ms_p99_beside_prefill']:.2f}x"
        )
    return "\n".join(lines)


def add_arguments(parser) -> None:
    defaults = MachineCosts()
    for f in fields(MachineCosts):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=float,
            default=getattr(defaults, f.name),
            help="(clients.bench.simulate.costs)",
        )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="agent traffic size (1.0: ~10k prefix)"
    )
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--cold-every", type=int, default=2)
    parser.add_argument("--trace-requests", type=int, default=200, help="first N of the hour")
    parser.add_argument(
        "--trace-scale", type=float, default=0.25, help="trace token counts times X"
    )
    parser.add_argument("--load", type=float, default=0.5, help="trace: offered prefill / capacity")
    parser.add_argument("--prefill-step", type=int, default=2048, help="fcfs: tokens a chunk")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument(
        "--wait-bound",
        type=float,
        default=ModelConfig.prefill_wait_bound,
        help="ours: the engine's --prefill-wait-bound",
    )
    parser.add_argument(
        "--chunk-max", type=int, help="also ours with --prefill-chunk-max N (default: none)"
    )
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")


def run(args) -> int:
    return emit(run_bench(args), args, format_table)
