"""glibc's malloc, where it is the process's: finding it, and giving its free pages back.

A process that allocates from several threads (the model loop, Ray's core
worker, the actor's event loop) holds what it freed inside malloc's arenas, in
pages the system still counts as its own. `trim` hands every whole free page
back (malloc_trim(0): a walk of every arena under its lock in turn) and says how
many resident bytes went. It costs about what it gives back: 10-16 ms for 12 MiB
and 87-213 ms for 192 MiB returned from among held blocks (a shared 2-core
machine), a few milliseconds only where little was free; meanwhile the calling
thread waits, and so does any other that allocates in the arena being walked.

Elsewhere (macOS, musl) there is no glibc: `glibc()` is None and `trim` does
nothing. `Trimmer` trims every interval on a daemon thread of its own (the
front end, the cache-manager actor); the model loop trims when it goes idle.
It knows nothing of what allocates, MLX's buffers included (MLX keeps its own
pool, released by `mx.clear_cache`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

log = logging.getLogger("lineage")


def glibc():
    """The C library, where it has glibc's malloc_trim and mallopt; else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim, libc.mallopt  # noqa: B018 -- glibc's, or no such names
    except (OSError, AttributeError):
        return None
    return libc


def resident_bytes() -> int:
    """This process's resident set (0 where /proc has none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def trim(libc) -> int:
    """Give malloc's free pages back now (`libc`: glibc(), None does nothing); the
    resident bytes that went (never below zero)."""
    if libc is None:
        return 0
    before = resident_bytes()
    libc.malloc_trim(0)
    return max(0, before - resident_bytes())


class Trimmer:
    """Every `interval` seconds, malloc's free pages go back to the system: `trims` counts
    the calls, `returned` the resident bytes they gave back (the resident set before less
    after, never below zero)."""

    def __init__(self, interval: float):
        self.interval = interval
        self.trims = 0
        self.returned = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._libc = glibc()

    def trim(self) -> int:
        """Give the free pages back now; the resident bytes that went."""
        if self._libc is None:
            return 0
        gone = trim(self._libc)
        self.trims += 1
        self.returned += gone
        return gone

    def start(self) -> bool:
        """Trim in a daemon thread until `stop`; False (and one log line) where malloc is
        not glibc's or the interval is 0."""
        if self.interval <= 0:
            return False
        if self._libc is None:
            log.info("lineage: malloc is not glibc's here; its free memory is its own to return")
            return False
        self._thread = threading.Thread(target=self._run, name="malloc-trim", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            gone = self.trim()
            if gone >= 1 << 20:
                log.debug("malloc trim returned %.1f MiB", gone / 2**20)
