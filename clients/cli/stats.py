"""`lineage stats`: a running engine's cache counters, as a table or as JSON.

One CacheStats call (with `--json`, one Inspect call: the counters plus the live
figures `lineage top` shows). It needs grpc alone: never MLX, never Ray.
"""

from __future__ import annotations

import argparse
import json

from clients.cli.args import EXIT_OK, add_server_arguments, format_stats
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
        if not args.json:
            print(format_stats(client.cache_stats()))
            return EXIT_OK
        live = client.inspect()
    # The CacheStats counters at the top, then the live figures `lineage top` shows.
    print(json.dumps({**live.pop("cache"), **live}, indent=2))
    return EXIT_OK
