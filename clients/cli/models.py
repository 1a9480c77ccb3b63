"""`lineage models`: what the Hugging Face cache holds; `lineage models rm REF` deletes one.

One line per model revision: its name, revision (the names that point at it and
the commit), size on disk, architecture, whether it is a hybrid the lineage cache
keeps state snapshots of, and whether the engine at --server serves it (asked
once, briefly; a server that does not answer leaves that column empty).
"""

from __future__ import annotations

import argparse

from clients.cli.args import EXIT_OK, UsageError, add_server_arguments

HELP = "list the models in the Hugging Face cache (rm REF: delete one)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=("rm",), help="rm: delete REF from the cache")
    p.add_argument("ref", nargs="?", metavar="REF", help="org/name (every revision) or @revision")
    add_server_arguments(p)


def run(args: argparse.Namespace) -> int:
    from engine import hub
    from engine.config import format_bytes

    settings = hub.HubSettings.from_env(args.env)
    if args.action == "rm":
        if not args.ref:
            raise UsageError("models rm needs REF (org/name or org/name@revision)")
        try:
            gone, freed = hub.remove(args.ref, settings)
        except ValueError as error:
            raise UsageError(str(error))
        print(f"lineage: removed {len(gone)} revision(s) of {args.ref}, {format_bytes(freed)}")
        return EXIT_OK
    found = hub.cached_models(settings)
    if not found:
        print(f"no models in {settings.cache_dir}")
        return EXIT_OK
    served = _served(args)
    rows = [("MODEL", "REVISION", "SIZE", "ARCHITECTURE", "HYBRID", "SERVED")]
    for m in found:
        revision = ",".join(m.refs + (m.revision[:12],))
        rows.append(
            (
                m.repo,
                revision if m.complete else revision + " (partial)",
                format_bytes(m.size),
                m.model_type or "?",
                "yes" if m.hybrid else "no",
                "" if served is None else "yes" if m.revision in served else "no",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return EXIT_OK


def _served(args) -> set[str] | None:
    """The directory names the engine at --server serves (a cached model's is its commit),
    or None when none answers."""
    from clients.client import Client, LineageError

    try:
        with Client(args.server, timeout=2.0, **args.connect) as client:
            info = client.model_info()
    except (LineageError, OSError):
        return None
    return {info.get("model", "")} | {m.get("model", "") for m in info.get("models", [])}
