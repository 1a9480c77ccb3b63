"""`lineage chat`: an interactive multi-turn chat over the sync Client.

Re-sends the whole conversation every turn, as agent frameworks do, so the
status line after each reply shows what the engine's cache saved. Reads lines
from any text stream (a terminal or a pipe); knows nothing about the server.
"""

from __future__ import annotations

import sys
from typing import TextIO

from clients.client import Chunk, Client, Final, LineageError, Progress, Result

EXIT_COMMANDS = ("/exit", "/quit")
_DIM, _RESET = "\x1b[2m", "\x1b[0m"
# Prefill progress is drawn only for prompts at least this long.
_PROGRESS_MIN_TOKENS = 256


def status_line(result: Result) -> str:
    """One line per turn: prompt tokens, cached tokens, restore kind, time to first token."""
    u, r = result.usage, result.restore
    share = f" ({u.cached_tokens / u.prompt_tokens:.0%})" if u.prompt_tokens else ""
    return (
        f"[prompt {u.prompt_tokens} tok, cached {u.cached_tokens}{share}, "
        f"restore {r.kind}, ttft {result.timing.ttft_ms:.1f} ms, "
        f"{u.completion_tokens} tok at {result.timing.decode_tps:.1f} tok/s]"
    )


class ProgressBar:
    """A prefill bar (rich) on a terminal stream; silent when it is not a terminal."""

    def __init__(self, out: TextIO):
        from rich.console import Console

        self.console = Console(file=out, stderr=out is sys.stderr)
        self.enabled = self.console.is_terminal
        self.progress = None  # a rich Progress while the bar is shown
        self.task = None

    def update(self, event: Progress) -> None:
        if not self.enabled or event.total < _PROGRESS_MIN_TOKENS:
            return
        if self.progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
            from rich.progress import Progress as RichProgress

            self.progress = RichProgress(
                TextColumn("prefill"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("tokens"),
                console=self.console,
                transient=True,  # the bar goes when the first token comes
            )
            self.progress.start()
            self.task = self.progress.add_task("prefill", total=event.total)
        self.progress.update(self.task, completed=event.done, total=event.total)

    def clear(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def stream_reply(client: Client, out: TextIO, err: TextIO, **request) -> Result:
    """Run one request, printing chunks to `out` as they arrive and progress to `err`."""
    bar = ProgressBar(err)
    stream = client.stream(**request)
    try:
        for event in stream:
            if isinstance(event, Progress):
                bar.update(event)
            elif isinstance(event, Chunk):
                bar.clear()
                out.write(event.text)
                out.flush()
            elif isinstance(event, Final):
                bar.clear()
    finally:
        bar.clear()
    return stream.result()


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
            result = stream_reply(
                client, out, err, messages=chat.messages, tools=chat.tools, **sampling
            )
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


def main_chat(
    server: str,
    system: str | None,
    tools: list[dict] | None,
    sampling: dict,
    connect: dict | None = None,
) -> int:
    """Chat on the process's stdin/stdout/stderr against `server`."""
    with Client(server, **(connect or {})) as client:
        return run_chat(client, Chat(system, tools), sampling, sys.stdin, sys.stdout, sys.stderr)
