"""`lineage bench checkpoint`: a checkpoint costs the state bytes only; a capture, a chunk.

Grows a conversation to ~1k and to ~8k tokens on the served model (in
process, the server's own Generator and CacheManager) and reports the bytes
of the entry (its KV rows plus its state) against the bytes of one of its
checkpoints, at both lengths. A checkpoint's bytes must not depend on the
prompt length.

Then what a capture point costs a prefill: the same cold prompt prefilled
with 0 and with k long-message points (k messages, a point in each),
interleaved over several rounds; the median time to first token with k
points minus the median without, per point, beside the
per-forward overhead and per-token cost measured at load. Together with the
bytes they give the spacing of long-message points (docs/benchmarks.md).
"""

from __future__ import annotations

from clients.bench.figures import Column, emit, table
from clients.bench.harness import add_serve_arguments, engine_config

HELP = "checkpoint bytes vs entry bytes at 1k and 8k tokens"


def measure(engine, length: int, seed: int, system: int = 0) -> dict:
    """Bytes of the entry and of its checkpoints after a conversation of `length` tokens
    (the first `system` of them a system block: long-message points inside it)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = engine.info.vocab_size
    tokens = [int(t) for t in rng.integers(10, vocab - 10, size=length)]
    r = engine.run(tokens, max_tokens=4, anchor_len=system, namespace=f"ckpt-{length}-{system}")
    entry = engine.tier.entries[r.plan.new_entry_id]
    kinds = {c.length: str(c.kind) for c in r.plan.captures}
    checkpoints = {n: s.nbytes for n, s in entry.states.items() if n != entry.length}
    from engine.runtime import layer_caches

    return {
        "tokens": entry.length,
        "entry_bytes": entry.nbytes,
        "kv_bytes": layer_caches.kv_bytes_per_token(entry.layers) * entry.length,
        "state_bytes": entry.states[entry.length].nbytes,
        "checkpoint_bytes": sorted(set(checkpoints.values())),
        "checkpoints": {str(n): b for n, b in sorted(checkpoints.items())},
        "message_points": sorted(n for n, k in kinds.items() if k == "system" and n in checkpoints),
    }


def run_bench(config, lengths=(1024, 8192), seed: int = 0) -> dict:
    from engine.runtime.local import LocalEngine

    engine = LocalEngine(config)
    rows = [measure(engine, n, seed) for n in lengths]
    long_system = measure(engine, 6000, seed + 1, system=5000)  # a 5k-token system block
    return {
        "model": engine.info.path,
        "rows": rows,
        "long_system": long_system,
        "checkpoint_bytes_equal": len({tuple(r["checkpoint_bytes"]) for r in rows}) == 1,
    }


def capture_cost(config, length: int = 4096, counts=(0, 8, 64), rounds: int = 7) -> dict:
    """Cold prefills of one `length`-token prompt with k capture points for k in `counts`
    (long-message points: k messages, one point in each), in rounds, each round every k
    once, in turn; the times to first token, ms."""
    import dataclasses

    import numpy as np

    from engine.runtime.local import LocalEngine
    from engine.runtime.model.loader import load_model

    loaded = load_model(config)
    info = loaded[2]
    rng = np.random.default_rng(11)
    tokens = [int(t) for t in rng.integers(10, info.vocab_size - 10, size=length)]
    engines, starts = {}, {}
    for k in counts:
        part = (length - 32) // k if k else 0  # k messages; a floor of part - 1: a point each
        starts[k] = tuple(i * part for i in range(k + 1)) if k else ()  # and a short tail
        cache = dataclasses.replace(config.cache, message_interval=max(part - 1, 0), message_max=k)
        engines[k] = LocalEngine(dataclasses.replace(config, cache=cache), loaded)
    ttft: dict[int, list[float]] = {k: [] for k in counts}
    for round_ in range(rounds + 1):  # round 0 warms each engine up
        for k, engine in engines.items():
            ms, plan = cold_prefill(engine, tokens, starts[k], f"capture-{k}-{round_}")
            got = sum(1 for c in plan.captures if c.kind == "message")
            assert got == k, f"{got} message points planned, {k} asked"
            if round_:
                ttft[k].append(ms)
    median = {k: float(np.median(v)) for k, v in ttft.items()}
    base = median[counts[0]]
    return {
        "length": length,
        "rounds": rounds,
        "ttft_ms": {str(k): v for k, v in ttft.items()},
        "median_ttft_ms": {str(k): v for k, v in median.items()},
        "ms_per_capture": {str(k): (median[k] - base) / k for k in counts if k},
        "forward_ms": info.forward_ms,
        "token_ms": info.token_ms,
    }


def cold_prefill(engine, tokens: list, starts: tuple, rid: str):
    """One request in a namespace of its own whose messages start at `starts`, through
    the engine's own manager and generator: (time to first token in ms, its plan)."""
    import time

    import numpy as np

    from engine.cache.messages import PlanRequest, PromptLayout
    from engine.runtime.events import Tokens
    from engine.runtime.requests import GenerationRequest, SamplingParams

    t0 = time.perf_counter()
    layout = PromptLayout(starts, roles=("user",) * len(starts))
    request = PlanRequest(rid, np.asarray(tokens, np.int32), namespace=rid, layout=layout)
    plan = engine.manager.plan(request)
    events: list = []
    run = GenerationRequest(
        rid, rid, tuple(tokens), plan, SamplingParams(max_tokens=1), time.time(), 0.0
    )
    engine.generator.submit(run, events.append)
    first = None
    while engine.generator.busy or engine.generator.pending:
        engine.generator.step()
        if first is None and any(isinstance(e, Tokens) for e in events):
            first = time.perf_counter()
    return ((first or time.perf_counter()) - t0) * 1000, plan


def report(out: dict) -> str:
    columns = [
        Column("tokens", 7),
        Column("entry bytes", 13, ","),
        Column("kv bytes", 13, ","),
        Column("checkpoint bytes", 17, ","),
        Column("checkpoint/entry", 17, ".4f"),
    ]
    rows = []
    for r in out["rows"]:
        ck = r["checkpoint_bytes"][0] if r["checkpoint_bytes"] else 0
        rows.append((r["tokens"], r["entry_bytes"], r["kv_bytes"], ck, ck / r["entry_bytes"]))
    lines = [f"model {out['model']}", *table(columns, rows)]
    lines.append(
        "checkpoint bytes equal at every length: "
        + ("yes" if out["checkpoint_bytes_equal"] else "NO")
    )
    long = out["long_system"]
    points = long["message_points"]
    each = long["checkpoints"].get(str(points[0]), 0) if points else 0
    lines.append(
        f"points in a 5000-token system block: {len(points)} at {points}, "
        f"{each:,} bytes each (the state only; {each / long['entry_bytes']:.4f} of the entry)"
    )
    cost = out.get("capture_cost")
    if cost:
        lines.append(
            f"a capture point in a cold {cost['length']}-token prefill (medians of "
            f"{cost['rounds']} rounds): "
            + ", ".join(
                f"{k} points {cost['median_ttft_ms'][k]:.0f} ms" for k in cost["median_ttft_ms"]
            )
        )
        per = cost["ms_per_capture"]
        most = per[max(per, key=int)]  # the most points: the least noisy figure
        token_ms = cost["token_ms"] or float("nan")
        lines.append(
            "  per capture point: "
            + ", ".join(f"{v:.2f} ms ({k} points)" for k, v in per.items())
            + f"; measured at load: a forward's overhead {cost['forward_ms']:.2f} ms, a token "
            f"{cost['token_ms']:.3f} ms (a capture ~ {most / token_ms:.1f} tokens of prefill)"
        )
        last = out["rows"][-1]
        per_token = last["kv_bytes"] / last["tokens"]
        if per_token and last["checkpoint_bytes"]:
            lines.append(
                f"  a checkpoint's bytes = {last['checkpoint_bytes'][0] / per_token:.1f} tokens "
                f"of KV ({per_token:,.0f} bytes per token)"
            )
    return "\n".join(lines)


def add_arguments(p) -> None:
    add_serve_arguments(p)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192])
    p.add_argument(
        "--capture-rounds",
        type=int,
        default=7,
        metavar="N",
        help="rounds of the capture-cost prefills (0: skip that part)",
    )
    p.add_argument("--json", help="write the figures to this file")


def run(args) -> int:
    config = engine_config(args)
    out = run_bench(config, tuple(args.lengths))
    if args.capture_rounds > 0:
        out["capture_cost"] = capture_cost(config, rounds=args.capture_rounds)
    return emit(out, args, report)
