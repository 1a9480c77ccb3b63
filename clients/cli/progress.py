"""A reply as it streams: text to one stream, a prefill bar (rich) to a terminal's other.

Shared by `lineage generate` and `lineage chat`. Knows the client's events
(Progress, Chunk, Final) and text streams; nothing of the server.
"""

from __future__ import annotations

import sys
from typing import TextIO

from clients.client import Chunk, Final, Progress, Result

# Prefill progress is drawn only for prompts at least this long.
PROGRESS_MIN_TOKENS = 256


class ProgressBar:
    """A prefill bar (rich) on a terminal stream; silent when it is not a terminal."""

    def __init__(self, out: TextIO):
        from rich.console import Console

        self.console = Console(file=out, stderr=out is sys.stderr)
        self.enabled = self.console.is_terminal
        self.progress = None  # a rich Progress while the bar is shown
        self.task = None

    def update(self, event: Progress) -> None:
        if not self.enabled or event.total < PROGRESS_MIN_TOKENS:
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


def print_stream(stream, out: TextIO, err: TextIO) -> Result:
    """Write a stream's chunks to `out` as they arrive, its prefill bar to `err`; its Result."""
    bar = ProgressBar(err)
    try:
        for event in stream:
            if isinstance(event, Progress):
                bar.update(event)
            elif isinstance(event, (Chunk, Final)):
                bar.clear()
                if isinstance(event, Chunk):
                    out.write(event.text)
                    out.flush()
    finally:
        bar.clear()
    return stream.result()
