"""`lineage stats`: a running engine's cache counters, as a table or as JSON.

One Inspect call: the CacheStats counters, then the disk tier's state
(clients.cli.disk_tier: writing or paused, writes lost by cause, the budget's
bytes against the files'); with `--json`, the counters plus the live figures
`lineage top` shows. It needs grpc alone: never MLX, never Ray.
"""

from __future__ import annotations

import argparse
import json

from clients.cli.args import EXIT_OK, add_server_arguments, format_stats
from clients.cli.disk_tier import disk_lines
from clients.client import Client

HELP = "show the engine's cache counters"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="print the counters and the live figures of `lineage top` as JSON",
    )
    add_server_arguments(p)


def run(args: argparse.Namespace) -> int:
    with Client(args.server, **args.connect) as client:
        live = client.inspect(recent=0 if not args.json else 20)
    if not args.json:
        print("\n".join([format_stats(live["cache"]), *disk_lines(live)]))
        return EXIT_OK
    # The CacheStats counters at the top, then the live figures `lineage top` shows.
    print(json.dumps({**live.pop("cache"), **live}, indent=2))
    return EXIT_OK
