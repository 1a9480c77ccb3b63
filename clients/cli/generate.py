"""`lineage generate`: one request, its reply streamed to stdout (or one JSON Result).

Reads the messages and tools from JSON files, sends one Generate call and
prints the text as it arrives, with a prefill bar on a terminal's stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from clients.cli.args import (
    EXIT_OK,
    UsageError,
    add_sampling_arguments,
    add_server_arguments,
    read_json_list,
    sampling_from_args,
)
from clients.cli.progress import print_stream
from clients.client import Client

HELP = "send one request and stream the reply"


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--messages", metavar="FILE.json", help="a JSON list of {role, content}")
    source.add_argument("--prompt", metavar="TEXT", help="raw prompt text")
    p.add_argument("--tools", metavar="FILE.json", help="a JSON list of tool definitions")
    p.add_argument("--stop-token-id", type=int, action="append", default=[], metavar="ID")
    p.add_argument("--json", action="store_true", help="print one JSON object (the Result)")
    add_sampling_arguments(p)
    add_server_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.tools and not args.messages:
        raise UsageError("--tools needs --messages")
    request = dict(
        messages=read_json_list(args.messages, "messages"),
        tools=read_json_list(args.tools, "tools"),
        prompt=args.prompt,
        stop_token_ids=args.stop_token_id,
        **sampling_from_args(args),
    )
    with Client(args.server, **args.connect) as client:
        try:
            stream = client.stream(**request)
        except ValueError as error:
            raise UsageError(str(error))
        if args.json:
            print(json.dumps(stream.result().to_json_dict()))
        else:
            print_stream(stream, sys.stdout, sys.stderr)
            sys.stdout.write("\n")
    return EXIT_OK
