"""`lineage fanout`: parallel sub-agents sharing one system prompt, against a running engine.

Parses the flags and runs clients.fanout (the agents and their shared prefix);
prints its table and writes its rows as JSON when asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from clients import fanout
from clients.cli.args import EXIT_OK, UsageError, add_server_arguments

HELP = "parallel sub-agents sharing one system prompt"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", type=int, required=True, metavar="N")
    p.add_argument("--turns", type=int, required=True, metavar="T")
    p.add_argument(
        "--system-tokens",
        type=int,
        default=2000,
        help="shared system prompt plus tools, in estimated tokens",
    )
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--namespace", default="")
    p.add_argument("--json", metavar="FILE", help="write {rows, summary} to FILE")
    add_server_arguments(p)


def run(args: argparse.Namespace) -> int:
    for flag in ("agents", "turns", "system_tokens", "max_tokens"):
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be > 0")
    rows = asyncio.run(
        fanout.run_fanout(
            args.server,
            args.agents,
            args.turns,
            args.system_tokens,
            args.max_tokens,
            args.seed,
            args.namespace,
            args.connect,
        )
    )
    print(fanout.format_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(fanout.rows_to_json(rows), f, indent=2)
    return EXIT_OK
