"""`lineage chat`: an interactive multi-turn chat over the sync Client.

Re-sends the whole conversation every turn, as agent frameworks do, so the
status line after each reply shows what the engine's cache saved. Reads lines
from any text stream (a terminal or a pipe); knows nothing about the server.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from clients.cli.args import (
    add_sampling_arguments,
    add_server_arguments,
    read_json_list,
    sampling_from_args,
)
from clients.cli.progress import print_stream
from clients.client import Client, LineageError, Result

HELP = "interactive multi-turn chat"
EXIT_COMMANDS = ("/exit", "/quit")
_DIM, _RESET = "\x1b[2m", "\x1b[0m"


def status_line(result: Result) -> str:
    """One line per turn: prompt tokens, cached tokens, restore kind, time to first token."""
    u, r = result.usage, result.restore
    share = f" ({u.cached_tokens / u.prompt_tokens:.0%})" if u.prompt_tokens else ""
    return (
        f"[prompt {u.prompt_tokens} tok, cached {u.cached_tokens}{share}, "
        f"restore {r.kind}, ttft {result.timing.ttft_ms:.1f} ms, "
        f"{u.completion_tokens} tok at {result.timing.decode_tps:.1f} tok/s]"
    )


class Chat:
    """The conversation: system message, user and assistant turns."""

    def __init__(self, system: str | None = None, tools: list[dict] | None = None):
        self.system = system
        self.tools = tools
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []


def run_chat(
    client: Client, chat: Chat, sampling: dict, lines: TextIO, out: TextIO, err: TextIO
) -> int:
    """Read user lines until EOF or /exit; 0 if every turn succeeded, else 1.

    /reset starts a new conversation. A failed turn is dropped from the
    conversation; an unreachable server ends the chat.
    """
    interactive = lines.isatty()
    dim = (lambda s: f"{_DIM}{s}{_RESET}") if out.isatty() else (lambda s: s)
    failed = False
    while True:
        if interactive:
            err.write("> ")
            err.flush()
        try:
            line = lines.readline()
        except KeyboardInterrupt:
            return 1 if failed else 0
        if not line:
            return 1 if failed else 0
        text = line.rstrip("\n")
        if text.strip() in EXIT_COMMANDS:
            return 1 if failed else 0
        if text.strip() == "/reset":
            chat.reset()
            continue
        if not text.strip():
            continue
        chat.messages.append({"role": "user", "content": text})
        try:
            stream = client.stream(messages=chat.messages, tools=chat.tools, **sampling)
            result = print_stream(stream, out, err)
        except (LineageError, KeyboardInterrupt) as error:
            chat.messages.pop()
            out.write("\n")
            if isinstance(error, KeyboardInterrupt):
                err.write("(cancelled)\n")
                continue
            err.write(f"lineage chat: {error}\n")
            failed = True
            if error.code == "UNAVAILABLE":
                return 1
            continue
        chat.messages.append({"role": "assistant", "content": result.text})
        out.write("\n" + dim(status_line(result)) + "\n")
        out.flush()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("--tools", metavar="FILE.json", help="a JSON list of tool definitions")
    add_sampling_arguments(p)
    add_server_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Chat on the process's stdin/stdout/stderr against `args.server`."""
    chat = Chat(args.system, read_json_list(args.tools, "tools"))
    with Client(args.server, **args.connect) as client:
        return run_chat(client, chat, sampling_from_args(args), sys.stdin, sys.stdout, sys.stderr)
