"""`lineage bench checkpoint`: a checkpoint costs the state bytes only.

Grows a conversation to ~1k and to ~8k tokens on the served model (in
process, the server's own Generator and CacheManager) and reports the bytes
of the entry (its KV rows plus its state) against the bytes of one of its
checkpoints, at both lengths. A checkpoint's bytes must not depend on the
prompt length.
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
        "message_points": sorted(
            n for n, k in kinds.items() if k == "message" and n in checkpoints
        ),
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
        f"long-message points in a 5000-token system block: {len(points)} at {points}, "
        f"{each:,} bytes each (the state only; {each / long['entry_bytes']:.4f} of the entry)"
    )
    return "\n".join(lines)


def add_arguments(p) -> None:
    add_serve_arguments(p)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192])
    p.add_argument("--json", help="write the figures to this file")


def run(args) -> int:
    return emit(run_bench(engine_config(args), tuple(args.lengths)), args, report)
