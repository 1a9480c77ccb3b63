"""`lineage bench memory`: the cache at the sizes users run, on shape-true models.

For each shape of engine/runtime/model/shapes/ (published configs cut in depth,
experts and vocab, random weights; engine.runtime.model.shape_models), a cut model
is written once under --dir and served in process: by default narrowed (hidden and MLP
widths 256; its caches are byte for byte the full-width cut model's, so every byte figure
and the replays are the same; the times of the forward steps are not), with --full-width
at the cut model's published widths; one conversation is run
through the engine and its stored entry measured (clients.bench.memory.measure):
the bytes of one checkpoint and of one token of KV in the batch, the RAM tier and
on disk, at the cut depth and at the published depth, and the capture, restore,
commit, disk write and read times, for exact checkpoints (the baseline) and at
the served --checkpoint-precision; the drift of a packed restore against an exact
one (clients.bench.memory.drift), on each shape and on the trained embedded model;
and the warm sessions agent traffic keeps in a budget, replayed through the
cache policy at each shape's published-depth bytes (clients.bench.memory.sessions),
and those a public hash-ID trace's conversations keep (clients.bench.memory.trace).
`--json` writes `width` ("narrowed" or "full") and, per shape, `checkpoint_bytes` and
`kv_bytes_per_token` ({"served", "baseline"}, at the published depth), `sessions` and
`trace` ({"baseline", "default"}: warm sessions; `sessions_replay`, `trace_replay`: every
figure) and `drift`.
"""

from __future__ import annotations

from clients.bench.figures import Column, emit, table
from clients.bench.harness import add_serve_arguments, engine_config

HELP = "cache bytes and times at the shapes users run (checkpoint, KV, tiers, disk)"
MiB, KiB, GiB = 1 << 20, 1 << 10, 1 << 30


def shape_dir(root, name: str, full_width: bool = False):
    from pathlib import Path

    return Path(root).expanduser() / (name if full_width else f"{name}-narrowed")


def run_bench(
    config,
    names,
    length: int,
    root,
    drift_tokens: int,
    budget: int,
    agents: int,
    trace: dict | None = None,
    full_width: bool = False,
):
    from clients.bench.memory.measure import measure_shape, shape_config
    from clients.bench.memory.sessions import warm_sessions
    from clients.bench.memory.trace import trace_sessions
    from engine.runtime.model.shape_models import load_shape, narrowed, write_shape_dir

    served = config.cache.stored_precision
    shapes = {}
    for name in names:
        shape = load_shape(name) if full_width else narrowed(load_shape(name))
        directory = write_shape_dir(shape, shape_dir(root, name, full_width))
        figures = measure_shape(
            shape_config(config, directory), shape, directory, length, served, drift_tokens
        )
        if budget:
            ck, kv = figures["checkpoint_bytes"], figures["kv_bytes_per_token"]["served"]
            # The baseline: exact checkpoints, every entry holding every row (the engine
            # before it stored shared rows once); the default: as served.
            variants = {"baseline": (ck["baseline"], False), "default": (ck["served"], True)}
            for p, nbytes in figures["checkpoint_bytes_by_precision"].items():
                variants[f"shared {p}"] = (nbytes, True)
            replay = warm_sessions(config.cache, kv, variants, budget, agents)
            figures["sessions_replay"] = replay
            figures["sessions"] = {k: replay[k]["warm_sessions"] for k in ("baseline", "default")}
            states = {k: variants[k] for k in ("baseline", "default")}
            replay = trace_sessions(config.cache, kv, states, budget, **(trace or {}))
            figures["trace_replay"] = replay
            figures["trace"] = {k: replay[k]["warm_sessions"] for k in ("baseline", "default")}
        shapes[name] = figures
        print(f"  {name}: done", flush=True)
    width = "full" if full_width else "narrowed"
    out = {"tokens": length, "served_precision": served, "width": width, "shapes": shapes}
    if drift_tokens:
        out["embedded_drift"] = embedded_drift(config, drift_tokens)
    return out


def embedded_drift(config, tokens: int) -> dict:
    """Drift of the packed precisions on the trained embedded model, on Python source."""
    import dataclasses
    import textwrap
    from pathlib import Path

    from clients.bench.memory.drift import measure_drift
    from engine.config.cache import CHECKPOINT_PRECISIONS
    from engine.runtime.model.loader import load_model

    config = dataclasses.replace(config, model=dataclasses.replace(config.model, path=None))
    loaded = load_model(config)
    # Python's own source, the text the embedded model was trained on; fixed by the
    # interpreter's version, not by the docs of this repository.
    text = Path(textwrap.__file__).read_text()
    prompt = loaded[1].encode(text[:8000])[:600]
    packed = [p for p in CHECKPOINT_PRECISIONS if p != "exact"]
    return measure_drift(config, loaded, prompt, packed, tokens)


def report(out: dict) -> str:
    served = out["served_precision"]
    columns = [
        Column("shape", 20),
        Column("layers", 7),
        Column("state/kv", 9),
        Column("ckpt MiB", 9, ".2f"),
        Column(f"{served} MiB", 11, ".2f"),
        Column("KV KiB/tok", 11, ".2f"),
        Column("ckpt=tokens", 12, ",.0f"),
        Column("capture ms", 11, ".2f"),
        Column("restore ms", 11, ".2f"),
        Column("KV ms/1k", 9, ".2f"),
        Column("commit ms/1k", 13, ".2f"),
        Column("disk MB/s w/r", 14),
    ]
    rows = []
    for s in out["shapes"].values():
        base = s["precisions"]["exact"]
        t, d = base["times"], base["disk"]
        ck, kv = s["checkpoint_bytes"], s["kv_bytes_per_token"]
        rows.append(
            (
                s["shape"],
                s["layers"]["layers"],
                f"{s['layers']['state_layers']}/{s['layers']['kv_layers']}",
                ck["baseline"] / MiB,
                ck["served"] / MiB,
                kv["baseline"] / KiB,
                ck["baseline"] / kv["baseline"] if kv["baseline"] else 0.0,
                t["capture_s"] * 1000,
                t["restore_state_s"] * 1000,
                t["restore_kv_s_per_1k"] * 1000,
                t["commit_s_per_1k"] * 1000,
                f"{d['write_mb_s']:.0f}/{d['read_mb_s']:.0f}",
            )
        )
    lines = [
        f"at the published depth (bytes measured per layer on the cut model, "
        f"{out.get('width', 'full')} width); {out['tokens']}-token conversations; "
        "times of the exact baseline",
        *table(columns, rows),
    ]
    for s in out["shapes"].values():
        base, packed = s["precisions"]["exact"], s["precisions"][served]
        cut = base["cut_depth"]
        lines.append(
            f"  {s['shape']}: cut model {s['cut_layers']['layers']} layers; checkpoint "
            f"{cut['checkpoint_bytes']['batch']:,} B in the batch, "
            f"{cut['checkpoint_bytes']['ram_tier']:,} B exact / "
            f"{packed['cut_depth']['checkpoint_bytes']['ram_tier']:,} B {served} in the RAM "
            f"tier; KV {cut['kv_bytes_per_token']['ram_tier']:,} B/token; file "
            f"{base['disk']['file_bytes']:,} B exact / {packed['disk']['file_bytes']:,} B "
            f"{served}"
        )
        for p, cost in s.get("restore_costs", {}).items():
            warm = s["warm_turn_costs"][p]
            lines.append(
                f"    restore of a {p} checkpoint (interleaved medians, two sequences merged): "
                f"{cost['packed_s'] * 1000:.2f} ms vs exact {cost['exact_s'] * 1000:.2f} ms = "
                f"{cost['ratio']:.2f}x; a warm turn's first step (restore, merge, a 32-token "
                f"forward): {warm['packed_s'] * 1000:.1f} vs {warm['exact_s'] * 1000:.1f} ms = "
                f"{warm['ratio']:.2f}x; capture "
                f"{s['precisions'][p]['times']['capture_s'] * 1000:.2f} ms"
            )
        for p, d in s.get("drift", {}).items():
            lines.append(
                f"    drift {p}: top-1 agreement {d['top1_agreement']:.4f}, mean KL "
                f"{d['mean_kl']:.2e} over {d['tokens']} tokens"
            )
    for s in out["shapes"].values():
        replay = s.get("sessions_replay")
        if replay:
            lines.append(
                f"  {s['shape']}: warm sessions in {replay['budget_bytes'] / GiB:.1f} GiB "
                f"({replay['traffic']['sessions']} sessions, {replay['traffic']['requests']} "
                "requests): "
                + ", ".join(
                    f"{k} {replay[k]['warm_sessions']} ({replay[k]['share_of_oracle']:.3f} of "
                    "the oracle)"
                    for k in replay
                    if k not in ("budget_bytes", "traffic")
                )
            )
        replay = s.get("trace_replay")
        if replay:
            t = replay["trace"]
            lines.append(
                f"  {s['shape']}: trace replay in {replay['budget_bytes'] / GiB:.1f} GiB "
                f"({t['source']}, {t['requests']} requests, {t['sessions']} sessions, "
                f"{t['returning_sessions']} returning; {t['block']} tokens a "
                f"{t['trace_block']}-token block): "
                + ", ".join(
                    f"{k} {replay[k]['warm_sessions']} warm, "
                    f"{replay[k]['warm_returning_sessions']} of the returning "
                    f"({replay[k]['share_of_oracle']:.3f} of the oracle)"
                    for k in ("baseline", "default")
                )
            )
    for p, d in out.get("embedded_drift", {}).items():
        lines.append(
            f"embedded (trained) model, drift {p}: top-1 agreement {d['top1_agreement']:.4f}, "
            f"mean KL {d['mean_kl']:.2e} over {d['tokens']} tokens"
        )
    return "\n".join(lines)


def add_arguments(p) -> None:
    from engine.config.units import GB, parse_bytes
    from engine.runtime.model import shape_names  # their names alone: no MLX

    add_serve_arguments(p)
    p.add_argument("--shapes", nargs="+", choices=shape_names(), default=shape_names())
    p.add_argument(
        "--tokens",
        type=int,
        default=256,
        help="the conversation's prompt length (a checkpoint's bytes and a token's KV do not "
        "depend on it; the capture, restore and disk times do)",
    )
    p.add_argument(
        "--full-width",
        action="store_true",
        help="serve the cut models at their published hidden and MLP widths (the caches are "
        "the same bytes as the default narrowed models'; the forward steps are slower)",
    )
    p.add_argument(
        "--dir",
        default="~/.cache/lineage-engine/shapes",
        help="where the cut models are written (once; reused while their config holds)",
    )
    p.add_argument(
        "--drift-tokens",
        type=int,
        default=64,
        metavar="N",
        help="greedy tokens compared after a packed vs an exact restore (0: skip)",
    )
    p.add_argument(
        "--budget",
        type=parse_bytes,
        default=12 * GB,
        metavar="SIZE",
        help="the RAM tier's budget of the warm-sessions replay, at the published depth "
        "(what a 64 GB Mac holding an 80B-A3B model in 4 bits leaves; 0: skip the replay)",
    )
    p.add_argument("--agents", type=int, default=12, help="sub-agents of the replay's traffic")
    p.add_argument(
        "--trace",
        metavar="PATH",
        help="a hash-ID trace (JSON lines, Mooncake's or Qwen-Bailian's format) replayed "
        "beside the agent traffic (default: traffic generated with the statistics of "
        "Mooncake's conversation trace; clients.bench.memory.trace_traffic)",
    )
    p.add_argument(
        "--trace-format",
        choices=("mooncake", "bailian"),
        default="mooncake",
        help="the trace's block size: mooncake 512 tokens, bailian 16",
    )
    p.add_argument(
        "--trace-block",
        type=int,
        default=64,
        metavar="N",
        help="tokens the replay gives one trace block (at most the trace's)",
    )
    p.add_argument(
        "--trace-every",
        type=int,
        default=8,
        metavar="N",
        help="replay one session of the trace in N (fewer users than the trace's service; "
        "1: every session, eight times the replay)",
    )
    p.add_argument("--json", help="write the figures to this file")


def run(args) -> int:
    config = engine_config(args)
    from pathlib import Path

    from clients.bench.memory.trace import TRACE_BLOCKS

    trace_block = TRACE_BLOCKS[args.trace_format]
    trace = {
        "lines": Path(args.trace).read_text().splitlines() if args.trace else None,
        "trace_block": trace_block,
        "block": min(args.trace_block, trace_block),
        "every": args.trace_every,
    }
    out = run_bench(
        config,
        args.shapes,
        args.tokens,
        args.dir,
        args.drift_tokens,
        args.budget,
        args.agents,
        trace,
        args.full_width,
    )
    return emit(out, args, report)
