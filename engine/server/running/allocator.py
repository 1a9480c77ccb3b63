"""glibc malloc in the front end: few arenas, and the free memory they hold given back.

The front end allocates from many threads (gRPC's, Ray's core worker's, the
bridge's), and glibc gives threads arenas of their own, up to eight per core;
what a request frees stays in its arena, in pages the system still counts. A
25-minute soak's front end held 6.7 -> 19.7 MiB free inside its arenas
(mallinfo2's fordblks) while its Python heap grew 4.6 MiB, all of it bounded
memos filling. `limit_arenas` caps the arenas (mallopt M_ARENA_MAX, before
the serve starts its threads) and `Trimmer` returns the free pages every
interval (engine.runtime.malloc: malloc_trim(0) walks every arena and gives
back each whole free page, under each arena's lock in turn; its time grows with
what it gives back).

Both are glibc's: elsewhere (macOS, musl) they do nothing and say so once in
the log. This module knows nothing of what allocates. The model loop trims on its own
when it goes idle (engine.runtime.loop); the cache manager is left to its
allocator.
"""

from __future__ import annotations

import logging
import threading

from engine.runtime.malloc import glibc, resident_bytes, trim

__all__ = ["Trimmer", "glibc", "limit_arenas", "resident_bytes"]

log = logging.getLogger("lineage")
M_ARENA_MAX = -8  # glibc's malloc.h


def limit_arenas(most: int) -> bool:
    """At most `most` malloc arenas from now on (0: glibc's own rule); whether it took."""
    libc = glibc()
    if most <= 0 or libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, most))


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
