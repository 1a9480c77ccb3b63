"""What this machine offers the defaults: its memory, and the disk room of a cache directory.

Read once, when `EngineConfig.from_sources` sizes the budgets and when the memory
limit is shared (engine.config.memory). It reads the system only: no setting, no share.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from engine.config.units import GB


def machine_memory() -> int:
    """This machine's physical memory (64G when it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 64 * GB


def disk_room(cache_dir: Path) -> int:
    """The free space of the disk holding `cache_dir`, plus the cache's own entry files.

    The cache's files count as available: measured at a restart, the free space
    alone would trim a cache that already filled its share at its first commit.
    """
    probe = cache_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free + _entry_bytes(cache_dir)


def _entry_bytes(cache_dir: Path) -> int:
    """Bytes of the entry files (`entries*/*.entry`) already in the cache directory."""
    total = 0
    for directory in cache_dir.glob("entries*") if cache_dir.is_dir() else ():
        for f in directory.glob("*.entry"):
            try:
                total += f.stat().st_size
            except OSError:  # removed meanwhile
                continue
    return total
