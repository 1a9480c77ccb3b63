"""The disk budget against the disk: bytes the budget holds that no file has, or the reverse.

The cache manager's disk index counts each file against the disk budget: at an
estimate while its write is queued, at the file's bytes once it is written.
With the writers idle the two sides must be equal; a difference that lasts is
a leak (the budget holds writes that never happened, and the tier fills with
nothing; or files the budget does not count). `disk_leaked_bytes` reads the
budget's side over the client (CacheStats.disk_bytes) and the files' side from
the cache directory itself (never the engine's own count of it), until they
agree or `settle_s` passes. Any benchmark with a client and the server's cache
directory can call it (`lineage bench faults` does, after its faults; the
soak may).
"""

from __future__ import annotations

import time
from pathlib import Path


def disk_leaked_bytes(
    client, cache_dir: str | Path, mode: str = "lineage", settle_s: float = 30.0
) -> int:
    """|bytes the disk budget holds - bytes of the files in the cache directory|, read until
    they agree or `settle_s` passes (queued writes count at an estimate until written).

    `client`: a clients.client.Client of the server; `cache_dir` and `mode`: its
    --cache-dir and --cache-mode. 0 when the server has no disk tier.
    """
    from engine.storage.directory import files_bytes
    from engine.storage.file_format import entries_dir

    directory = entries_dir(cache_dir, mode)
    deadline = time.monotonic() + settle_s
    while True:
        held = int(client.cache_stats().get("disk_bytes", 0))
        leaked = abs(held - files_bytes(directory))
        if leaked == 0 or time.monotonic() >= deadline:
            return leaked
        time.sleep(0.5)
