"""An opt-in trace of the front end's Python heap, for finding what grows in a long serve.

With `LINEAGE_HEAP_TRACE=<frames>` the serve starts tracemalloc before Ray and
the engine (`start`), and each SIGUSR2 writes a snapshot of every traced block
into `LINEAGE_HEAP_TRACE_DIR` (`write_snapshot`: `heap-<pid>-<n>.snapshot`,
renamed into place once whole, after a `.json` beside it with the traced
total and glibc malloc's own counts: `mallinfo2`, which sees what native code
allocates and what malloc holds free; taking a snapshot makes a tuple per
block, and malloc is trimmed after it, yet about 3 MiB of a soak's front end
stays in Python's own arenas after each), and the cyclic collector's own figures
(`gc_counts`: objects per generation, full collections so far: garbage in
cycles waits in the oldest generation for the next full collection).
Reading them is the reader's
(`tracemalloc.Snapshot.load`, `compare_to`: clients.bench.soak.heap). It
knows nothing of what allocates, and sees only Python's allocator: memory a
native library takes (gRPC, Ray's core worker, glibc arenas) shows in RSS,
not here. Tracing costs time on every allocation: it is off by default.
"""

from __future__ import annotations

import gc
import itertools
import json
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
    traced, peak = tracemalloc.get_traced_memory()
    counts = {"traced": traced, "peak": peak, "overhead": tracemalloc.get_tracemalloc_memory()}
    counts["malloc"] = malloc_counts()
    counts["gc"] = gc_counts()
    path.with_suffix(".json").write_text(json.dumps(counts))
    snapshot = tracemalloc.take_snapshot()
    snapshot.dump(str(path) + ".part")
    del snapshot
    _trim()  # what the snapshot's own tuples took goes back, not into the next figures
    os.replace(str(path) + ".part", path)
    log.info("heap snapshot %s: %d bytes traced (peak %d)", path, traced, peak)
    return path


def _trim() -> None:
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def gc_counts() -> dict:
    """The cyclic collector's figures: objects tracked in each generation, and per
    generation its collections so far and the objects they freed (gc.get_stats)."""
    return {
        "objects": [len(gc.get_objects(generation)) for generation in range(3)],
        "frozen": gc.get_freeze_count(),
        "stats": gc.get_stats(),
    }


_MALLINFO2 = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


def malloc_counts() -> dict[str, int]:
    """glibc's mallinfo2 over all its arenas (arena: bytes taken from the system by sbrk and
    thread heaps; hblkhd: in mmapped chunks; uordblks: in use; fordblks: free); {} off glibc."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2.split()]

    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return {name: int(getattr(info, name)) for name in _MALLINFO2.split()}
