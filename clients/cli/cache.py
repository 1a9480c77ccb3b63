"""`lineage cache ls|stats|rm|prune`: inspect and clean the disk tier's entry files.

Works on a cache directory directly (it reads the files' headers; no server
needed), or asks a running server (`--server`): `stats` then shows the
server's CacheStats counters, and the other actions take the served model's
fingerprint from it. Which files are "this model's" otherwise: `--fingerprint`,
else the fingerprint of the most recently written sound file.

`rm` and `prune` refuse to touch a directory a running server holds (its lock
file) unless `--force`; that server then treats a removed file as a miss.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from clients.cli.args import UsageError, add_settings, format_stats
from engine.config import CacheConfig, default_cache_dir, format_bytes
from engine.config.declare import UNSET, setting_named

HELP = "inspect and clean the disk tier: ls, stats, rm, prune"
CACHE_DIR = setting_named(CacheConfig, "cache_dir")  # as `lineage serve --cache-dir`


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_text in (
        ("ls", "list the entry files"),
        ("stats", "totals of the directory, or a server's counters"),
        ("rm", "remove entry files by id or namespace"),
        ("prune", "remove foreign, damaged, leftover and over-budget files"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_settings(p, [CACHE_DIR])
        p.add_argument(
            "--server",
            dest="via_server",
            metavar="HOST:PORT",
            help="ask this running server (stats: its counters; else: its fingerprint)",
        )
        p.add_argument("--json", action="store_true", help="print JSON")
        if name != "stats":
            p.add_argument("--fingerprint", help="the model fingerprint whose files are kept")
        if name == "rm":
            p.add_argument("ids", nargs="*", type=int, metavar="ID", help="entry ids")
            p.add_argument("--namespace", help="remove every entry of this namespace")
        if name == "prune":
            p.add_argument(
                "--budget",
                metavar="SIZE",
                help="disk budget (default: as `lineage serve --disk-budget`)",
            )
            p.add_argument("--dry-run", action="store_true", help="say what would go")
        if name in ("rm", "prune"):
            p.add_argument(
                "--force", action="store_true", help="even while a server holds the directory"
            )


def run(args: argparse.Namespace) -> int:
    env = getattr(args, "env", None) or os.environ
    if args.action == "stats" and args.via_server:
        from clients.client import Client

        with Client(args.via_server, **getattr(args, "connect", {})) as client:
            stats = client.cache_stats()
        print(json.dumps(stats, indent=2) if args.json else format_stats(stats))
        return 0
    directory = _entries(args, env)
    return {"ls": _ls, "stats": _stats, "rm": _rm, "prune": _prune}[args.action](
        args, directory, env
    )


def _entries(args, env) -> Path:
    """The entries directory under --cache-dir, else $LINEAGE_CACHE_DIR, else the default."""
    from engine.storage.file_format import entries_dir

    root = CACHE_DIR.read({"cache_dir": args.cache_dir}, env)
    return entries_dir(default_cache_dir() if root is UNSET else Path(root).expanduser())


def _own_fingerprint(args, files) -> tuple[str | None, str]:
    """(fingerprint, where it came from) of the files that count as this model's."""
    if getattr(args, "fingerprint", None):
        return args.fingerprint, "--fingerprint"
    if args.via_server:
        from clients.client import Client

        with Client(args.via_server, **getattr(args, "connect", {})) as client:
            return client.model_info()["fingerprint"], f"server {args.via_server}"
    sound = [f for f in files if f.header is not None]
    if not sound:
        return None, "no sound file"
    newest = max(sound, key=lambda f: f.mtime)
    return newest.header.fingerprint, f"the newest file ({newest.path.name})"


def _row(f, own: str | None) -> dict:
    h = f.header
    status = "damaged: " + f.problem if f.problem else "own" if h.fingerprint == own else "foreign"
    row = {
        "id": f.entry_id,
        "file": f.path.name,
        "bytes": f.nbytes,
        "status": status,
        "modified": f.mtime,
    }
    if h is not None:
        row.update(
            role=h.role,
            namespace=h.namespace,
            tokens=h.length,
            prompt_len=h.prompt_len,
            checkpoints=[list(c) for c in h.checkpoints],
            fingerprint=h.fingerprint,
        )
    return row


def _ls(args, directory: Path, env) -> int:
    from engine.storage.directory import scan_directory

    files = scan_directory(directory, remove_temps=False).files
    own, source = _own_fingerprint(args, files)
    rows = [_row(f, own) for f in sorted(files, key=lambda f: f.mtime)]
    if args.json:
        print(
            json.dumps({"directory": str(directory), "fingerprint": own, "files": rows}, indent=2)
        )
        return 0
    print(f"{directory}: {len(rows)} files; this model's fingerprint {own} ({source})")
    now = time.time()
    for r in rows:
        what = ""
        if "role" in r:
            points = ",".join(str(n) for n, _ in r["checkpoints"]) or "-"
            what = (
                f"{r['role']:<12} ns={r['namespace'] or '-':<10} {r['tokens']:>7} tokens "
                f"(prompt {r['prompt_len']}, checkpoints {points})"
            )
        age = _age(now - r["modified"])
        print(f"{r['id']:>8}  {format_bytes(r['bytes']):>10}  {age:>6}  {r['status']:<8} {what}")
    return 0


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _summary(directory: Path) -> dict:
    from collections import Counter

    from engine.storage.directory import scan_directory

    scan = scan_directory(directory, remove_temps=False)
    roles: Counter = Counter()
    prints: Counter = Counter()
    for f in scan.files:
        if f.header is not None:
            roles[f.header.role] += 1
            prints[f.header.fingerprint] += 1
    temps = [p for p in directory.glob(".*.tmp")] if directory.is_dir() else []
    return {
        "directory": str(directory),
        "files": len(scan.files),
        "disk_bytes": sum(f.nbytes for f in scan.files),
        "conversations": roles["conversation"],
        "anchors": roles["anchor"],
        "damaged_files": sum(f.problem is not None for f in scan.files),
        "temporary_files": len(temps),
        "fingerprints": dict(prints),
    }


def _stats(args, directory: Path, env) -> int:
    summary = _summary(directory)
    print(json.dumps(summary, indent=2) if args.json else format_stats(summary))
    return 0


def _held_by_server(directory: Path) -> bool:
    from engine.storage.directory import lock_directory

    if not directory.is_dir():
        return False
    lock = lock_directory(directory, wait=0)
    if lock is None:
        return True
    lock.close()
    return False


def _remove(args, directory: Path, doomed: list, why: dict, temps=()) -> int:
    from engine.storage.directory import delete_files

    if doomed and not getattr(args, "dry_run", False):
        if _held_by_server(directory) and not args.force:
            raise UsageError(f"a running server holds {directory}; stop it or pass --force")
        for f in doomed:
            delete_files(directory, f.entry_id)
    freed = sum(f.nbytes for f in doomed)
    verb = "would remove" if getattr(args, "dry_run", False) else "removed"
    if args.json:
        print(
            json.dumps(
                {
                    verb.replace(" ", "_"): [
                        {"id": f.entry_id, "bytes": f.nbytes, "why": why[f.entry_id]}
                        for f in doomed
                    ],
                    "bytes": freed,
                    "removed_temporary": [p.name for p in temps],
                },
                indent=2,
            )
        )
    else:
        for path in temps:
            print(f"removed {path.name} (left by an interrupted write)")
        for f in doomed:
            print(f"{verb} {f.path.name} ({why[f.entry_id]})")
        print(f"{verb} {len(doomed)} files, {format_bytes(freed)}")
    return 0


def _rm(args, directory: Path, env) -> int:
    from engine.storage.directory import scan_directory

    if not args.ids and args.namespace is None:
        raise UsageError("name entry ids or --namespace")
    files = scan_directory(directory, remove_temps=False).files
    wanted = set(args.ids)
    doomed = [
        f
        for f in files
        if f.entry_id in wanted
        or (
            args.namespace is not None
            and f.header is not None
            and f.header.namespace == args.namespace
        )
    ]
    missing = wanted - {f.entry_id for f in doomed}
    if missing:
        raise UsageError(f"no entry files with ids {sorted(missing)} in {directory}")
    return _remove(args, directory, doomed, {f.entry_id: "asked" for f in doomed})


def _prune(args, directory: Path, env) -> int:
    """Damaged files, other models' files, leftover temporary files, then LRU over the budget."""
    from engine.config import EngineConfig
    from engine.storage.directory import index_scan, scan_directory

    flags = {"cache_dir": str(directory.parent), "disk_budget": args.budget}
    try:
        config = EngineConfig.from_sources(flags, env).cache
    except ValueError as error:
        raise UsageError(str(error))
    clean_temps = not args.dry_run and (args.force or not _held_by_server(directory))
    scan = scan_directory(directory, remove_temps=clean_temps)
    own, source = _own_fingerprint(args, scan.files)
    caps = (config.anchor_max_entries, config.anchor_max_bytes)
    index = index_scan(scan, own or "", config.disk_budget, caps)
    by_id = {f.entry_id: f for f in scan.files}
    why = {}
    for entry_id, f in list(index.files.items()):
        if f.entry is None:  # never matched by this model: goes whatever the budget
            problem = by_id[entry_id].problem
            why[entry_id] = f"damaged: {problem}" if problem else "another model's file"
            index.remove(entry_id)
    for f in index.victims():  # the server's own eviction order
        why[f.entry_id] = f"over the {format_bytes(config.disk_budget)} budget"
    if not args.json:
        print(f"keeping fingerprint {own} ({source})")
    return _remove(args, directory, [by_id[i] for i in why], why, scan.removed_temps)
