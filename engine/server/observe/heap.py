"""An opt-in trace of the front end's Python heap, for finding what grows in a long serve.

With `LINEAGE_HEAP_TRACE=<frames>` the serve starts tracemalloc before Ray and
the engine (`start`), and each SIGUSR2 writes a snapshot of every traced block
into `LINEAGE_HEAP_TRACE_DIR` (`write_snapshot`: `heap-<pid>-<n>.snapshot`,
renamed into place once whole). Reading them is the reader's
(`tracemalloc.Snapshot.load`, `compare_to`: clients.bench.soak.heap). It
knows nothing of what allocates, and sees only Python's allocator: memory a
native library takes (gRPC, Ray's core worker, glibc arenas) shows in RSS,
not here. Tracing costs time on every allocation: it is off by default.
"""

from __future__ import annotations

import itertools
import logging
import os
import tracemalloc
from pathlib import Path

log = logging.getLogger("lineage")
_numbers = itertools.count(1)


def start(frames: int) -> None:
    """Trace every allocation from now on, keeping `frames` frames of each."""
    tracemalloc.start(frames)


def write_snapshot(directory: str | None) -> Path:
    """A snapshot of the traced heap in `directory` (default: the working directory)."""
    folder = Path(directory or ".")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"heap-{os.getpid()}-{next(_numbers)}.snapshot"
    snapshot = tracemalloc.take_snapshot()
    snapshot.dump(str(path) + ".part")
    os.replace(str(path) + ".part", path)
    traced, peak = tracemalloc.get_traced_memory()
    log.info("heap snapshot %s: %d bytes traced (peak %d)", path, traced, peak)
    return path
