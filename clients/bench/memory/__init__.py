"""`lineage bench memory`: the cache at the sizes users run, on shape-true models.

For each shape of engine/runtime/model/shapes/ (published configs cut in depth,
experts and vocab, random weights; engine.runtime.model.shape_models), a cut model
is written once under --dir and served in process; one conversation is run
through the engine and its stored entry measured (clients.bench.memory.measure):
the bytes of one checkpoint and of one token of KV in the batch, the RAM tier and
on disk, at the cut depth and at the published depth, and the capture, restore,
commit, disk write and read times. `--json` writes, per shape,
`checkpoint_bytes` and `kv_bytes_per_token` at the published depth.
"""

from __future__ import annotations

from clients.bench.figures import Column, emit, table
from clients.bench.harness import add_serve_arguments, engine_config

HELP = "cache bytes and times at the shapes users run (checkpoint, KV, tiers, disk)"
MiB, KiB = 1 << 20, 1 << 10


def shape_dir(root, name: str):
    from pathlib import Path

    return Path(root).expanduser() / name


def run_bench(config, names, length: int, root) -> dict:
    from clients.bench.memory.measure import measure_shape, shape_config
    from engine.runtime.model.shape_models import load_shape, write_shape_dir

    shapes = {}
    for name in names:
        shape = load_shape(name)
        directory = write_shape_dir(shape, shape_dir(root, name))
        shapes[name] = measure_shape(shape_config(config, directory), shape, directory, length)
        print(f"  {name}: done", flush=True)
    return {"tokens": length, "shapes": shapes}


def report(out: dict) -> str:
    columns = [
        Column("shape", 22),
        Column("layers", 7),
        Column("state/kv", 9),
        Column("ckpt MiB", 9, ".2f"),
        Column("KV KiB/tok", 11, ".2f"),
        Column("ckpt=tokens", 12, ",.0f"),
        Column("capture ms", 11, ".2f"),
        Column("restore ms", 11, ".2f"),
        Column("KV restore ms/1k", 17, ".2f"),
        Column("commit ms/1k", 13, ".2f"),
        Column("disk MB/s w/r", 14),
    ]
    rows = []
    for s in out["shapes"].values():
        full, t, d = s["full_depth"], s["times"], s["disk"]
        ck, kv = s["checkpoint_bytes"], s["kv_bytes_per_token"]
        rows.append(
            (
                s["shape"],
                full["layers"],
                f"{full['state_layers']}/{full['kv_layers']}",
                ck / MiB,
                kv / KiB,
                ck / kv if kv else 0.0,
                t["capture_s"] * 1000,
                t["restore_state_s"] * 1000,
                t["restore_kv_s_per_1k"] * 1000,
                t["commit_s_per_1k"] * 1000,
                f"{d['write_mb_s']:.0f}/{d['read_mb_s']:.0f}",
            )
        )
    lines = [
        f"published depth (bytes measured per layer on the cut model); {out['tokens']} tokens",
        *table(columns, rows),
    ]
    for s in out["shapes"].values():
        cut = s["cut_depth"]
        lines.append(
            f"  {s['shape']}: cut model {cut['layers']} layers, checkpoint "
            f"{cut['checkpoint_bytes']['ram_tier']:,} B in the RAM tier "
            f"({cut['checkpoint_bytes']['batch']:,} in the batch), KV "
            f"{cut['kv_bytes_per_token']['ram_tier']:,} B/token; file "
            f"{s['disk']['file_bytes']:,} B for {s['disk']['entry_bytes']:,} B in RAM"
        )
    return "\n".join(lines)


def add_arguments(p) -> None:
    from engine.runtime.model.shape_models import shape_names

    add_serve_arguments(p)
    p.add_argument("--shapes", nargs="+", choices=shape_names(), default=shape_names())
    p.add_argument("--tokens", type=int, default=1024, help="the conversation's prompt length")
    p.add_argument(
        "--dir",
        default="~/.cache/lineage-engine/shapes",
        help="where the cut models are written (once; reused while their config holds)",
    )
    p.add_argument("--json", help="write the figures to this file")


def run(args) -> int:
    config = engine_config(args)
    out = run_bench(config, args.shapes, args.tokens, args.dir)
    return emit(out, args, report)
