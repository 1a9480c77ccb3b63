"""Download progress: bytes, rate and time left, on the terminal and in the log.

A thread watches the repository's blob folder of the cache grow (huggingface_hub
writes each file there as an .incomplete blob, then renames it), so it needs no
hook into the download. On a terminal it redraws one bar; otherwise it prints a
line every `every_s` seconds; each such line also goes to the log
(`lineage.hub`), and `on_bytes(done, total)` hears every reading.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Callable, TextIO

log = logging.getLogger("lineage.hub")
TICK_S = 0.25  # how often the bar is redrawn on a terminal


def _folder_bytes(folder: Path, partial: bool = True) -> int:
    """The bytes of the files in `folder` (`partial`: .incomplete ones too)."""
    try:
        return sum(
            p.stat().st_size
            for p in folder.iterdir()
            if p.is_file() and (partial or not p.name.endswith(".incomplete"))
        )
    except FileNotFoundError:
        return 0


def describe(done: int, total: int, seconds: float) -> str:
    """`1.2 GB of 4.5 GB, 85 MB/s, 39 s left`."""
    from engine.config.units import format_bytes

    rate = done / seconds if seconds > 0 else 0.0
    left = f"{(total - done) / rate:.0f} s left" if rate > 0 and total > done else "-"
    return f"{format_bytes(done)} of {format_bytes(total)}, {format_bytes(int(rate))}/s, {left}"


class DownloadProgress:
    """Watches one download; `start` it with the blob folder and the bytes to come."""

    def __init__(
        self,
        out: TextIO | None = None,
        every_s: float = 5.0,
        on_bytes: Callable[[int, int], None] | None = None,
    ):
        self.out = out if out is not None else sys.stderr
        self.every_s = every_s
        self.on_bytes = on_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, name: str, blobs: Path, total: int) -> None:
        self.name, self.blobs, self.total = name, blobs, total
        self.base = _folder_bytes(blobs, partial=False)  # a resumed part counts as done
        self.t0 = time.monotonic()
        tty = getattr(self.out, "isatty", lambda: False)()
        self.tty = tty
        self._say(f"lineage: downloading {name}: {describe(0, total, 0)}")
        self._thread = threading.Thread(target=self._watch, name="hub-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        done = self._done()
        if self.tty:
            self.out.write("\n")
        self._say(f"lineage: {self.name}: {describe(done, self.total, self._elapsed())}")

    def _elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _done(self) -> int:
        return min(self.total, max(0, _folder_bytes(self.blobs) - self.base))

    def _watch(self) -> None:
        last_line = time.monotonic()
        while not self._stop.wait(TICK_S if self.tty else min(TICK_S * 4, self.every_s)):
            done = self._done()
            if self.on_bytes is not None:
                self.on_bytes(done, self.total)
            if self.tty:
                self._bar(done)
            if time.monotonic() - last_line >= self.every_s:
                last_line = time.monotonic()
                said = describe(done, self.total, self._elapsed())
                line = f"lineage: downloading {self.name}: {said}"
                log.info(line)
                if not self.tty:
                    self.out.write(line + "\n")
                    self.out.flush()

    def _bar(self, done: int, width: int = 30) -> None:
        filled = int(width * done / self.total) if self.total else width
        text = describe(done, self.total, self._elapsed())
        self.out.write(f"\r{self.name} [{'#' * filled}{'.' * (width - filled)}] {text}\033[K")
        self.out.flush()

    def _say(self, line: str) -> None:
        log.info(line)
        self.out.write(line + "\n")
        self.out.flush()
