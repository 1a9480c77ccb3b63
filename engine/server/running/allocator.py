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
when it goes idle (engine.runtime.loop); the cache-manager actor runs a Trimmer of
its own (engine.actors.cache_manager).
"""

from __future__ import annotations

import logging

from engine.runtime.malloc import Trimmer, glibc, resident_bytes

__all__ = ["Trimmer", "glibc", "limit_arenas", "resident_bytes"]  # Trimmer: engine.runtime.malloc

log = logging.getLogger("lineage")
M_ARENA_MAX = -8  # glibc's malloc.h


def limit_arenas(most: int) -> bool:
    """At most `most` malloc arenas from now on (0: glibc's own rule); whether it took."""
    libc = glibc()
    if most <= 0 or libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, most))
