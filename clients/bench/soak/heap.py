"""The front end's Python heap at two times in each life of the serve (`--heap-trace-at A,B`).

The soak starts the serve with `LINEAGE_HEAP_TRACE`
(engine.server.observe.heap: tracemalloc from the start, a snapshot file on
SIGUSR2) and `HeapTrace` asks each life of the front end for a snapshot A and
B minutes after its process began, noting its RSS and anonymous RSS just
before and just after (taking a snapshot builds a tuple per traced block in
the front end, about 3 MiB of which stays after it: `rss_growth_after_first_bytes`
leaves the first one's out). `growth` compares the two snapshots by line
(`compare_to(..., "lineno")`, the `top` largest differences) beside the RSS
growth: traced growth close to RSS growth is Python's heap, RSS growing where
the traced heap does not is native memory (glibc arenas, gRPC, Ray's core
worker), which glibc's counts at each snapshot part further: in use, or held
free. The snapshots are read only at the end, in the soak's process.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

FRAMES = 1  # a line is all `compare_to(..., "lineno")` groups by
TOP = 25


def memory(pid: int) -> dict:
    """VmRSS and RssAnon of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                out["rss" if key == "VmRSS" else "rss_anon"] = int(value.split()[0]) * 1024
    return out


class HeapTrace(threading.Thread):
    """Snapshots of each life of `serve`'s front end at `minutes` into it, in `folder`."""

    def __init__(self, serve, minutes: list[float], folder: Path, halt: threading.Event):
        super().__init__(name="soak-heap-trace", daemon=True)
        self.serve, self.minutes, self.folder, self.halt = serve, sorted(minutes), folder, halt
        self.lives: dict[int, list[dict]] = {}  # front end pid -> its snapshots so far
        self.errors: list[str] = []

    def environment(self) -> dict:
        """What the serve is started with for its snapshots."""
        return {"LINEAGE_HEAP_TRACE": str(FRAMES), "LINEAGE_HEAP_TRACE_DIR": str(self.folder)}

    def run(self) -> None:
        import psutil

        while not self.halt.wait(1.0):
            process = self.serve.process
            if process is None:
                continue
            taken = self.lives.setdefault(process.pid, [])
            if len(taken) == len(self.minutes):
                continue
            try:
                age = time.time() - psutil.Process(process.pid).create_time()
            except psutil.Error:
                continue
            if age >= self.minutes[len(taken)] * 60:
                try:
                    taken.append(self.take(process.pid, age / 60))
                except (OSError, TimeoutError) as e:  # counted: this life gives no pair
                    self.errors.append(f"{type(e).__name__}: {e}")
                    taken.append({"minute": round(age / 60, 2), "error": str(e)})

    def take(self, pid: int, minute: float, timeout: float = 300) -> dict:
        """SIGUSR2 to the front end, then wait for its snapshot file."""
        before = memory(pid)
        known = set(self.folder.glob(f"heap-{pid}-*.snapshot"))
        t0 = time.monotonic()
        os.kill(pid, signal.SIGUSR2)
        while True:
            new = set(self.folder.glob(f"heap-{pid}-*.snapshot")) - known
            if new:
                break
            if not os.path.exists(f"/proc/{pid}"):
                raise OSError(f"the front end {pid} ended instead of writing a heap snapshot")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"no heap snapshot from {pid} within {timeout:.0f} s")
            time.sleep(0.5)
        return {
            "minute": round(minute, 2),
            "path": str(new.pop()),
            "seconds": round(time.monotonic() - t0, 2),
            "before": before,
            "after": memory(pid),
        }

    def growth(self) -> list[dict]:
        """Per life with two snapshots: the first against the last."""
        out = []
        for pid, taken in self.lives.items():
            if len(taken) >= 2 and all("path" in s for s in taken):
                out.append({"pid": pid, **growth(taken[0], taken[-1])})
        return out


def growth(a: dict, b: dict, top: int = TOP) -> dict:
    """Snapshot `b` against `a` by line, beside the RSS between them (both read just before
    each snapshot was asked for)."""
    import tracemalloc

    first, last = tracemalloc.Snapshot.load(a["path"]), tracemalloc.Snapshot.load(b["path"])
    traced = [sum(t.size for t in s.traces) for s in (first, last)]
    lines = last.compare_to(first, "lineno")
    counts = [json.loads(Path(x["path"]).with_suffix(".json").read_text()) for x in (a, b)]
    malloc = {
        k: [counts[0]["malloc"][k], counts[1]["malloc"][k]]
        for k in ("arena", "hblkhd", "uordblks", "fordblks")
        if k in counts[0]["malloc"]
    }
    return {
        "malloc": malloc,  # glibc's counts at each snapshot (engine.server.observe.heap)
        "gc": [c.get("gc") for c in counts],  # the cyclic collector's, at each
        "tracemalloc_overhead_bytes": [c["overhead"] for c in counts],
        "minutes": [a["minute"], b["minute"]],
        "rss_growth_bytes": b["before"]["rss"] - a["before"]["rss"],
        "rss_anon_growth_bytes": b["before"]["rss_anon"] - a["before"]["rss_anon"],
        # from just after the first (malloc trimmed then: engine.server.observe.heap)
        "rss_growth_after_first_bytes": b["before"]["rss"] - a["after"]["rss"],
        "traced_bytes": traced,
        "traced_growth_bytes": traced[1] - traced[0],
        "snapshot_rss_cost_bytes": a["after"]["rss"] - a["before"]["rss"],
        "snapshot_seconds": [a["seconds"], b["seconds"]],
        "top": [
            {
                "line": f"{s.traceback[0].filename}:{s.traceback[0].lineno}",
                "size_diff": s.size_diff,
                "count_diff": s.count_diff,
                "size": s.size,
                "count": s.count,
            }
            for s in lines[:top]
        ],
    }


def format_growth(lives: list[dict]) -> list[str]:
    """The report's lines: per life, the RSS and traced growth and the top lines."""
    mib = 2**20
    out = []
    for life in lives:
        out.append(
            f"  front end {life['pid']}, minute {life['minutes'][0]:.1f} -> "
            f"{life['minutes'][1]:.1f}: RSS {life['rss_growth_bytes'] / mib:+.1f} MiB "
            f"(anon {life['rss_anon_growth_bytes'] / mib:+.1f}), traced "
            f"{life['traced_growth_bytes'] / mib:+.1f} MiB of "
            f"{life['traced_bytes'][1] / mib:.1f}; malloc "
            + ", ".join(f"{k} {(y - x) / mib:+.1f}" for k, (x, y) in life["malloc"].items())
        )
        for s in life["top"][:10]:
            out.append(
                f"    {s['size_diff'] / 1024:+9.1f} KiB {s['count_diff']:+7d} blocks  {s['line']}"
            )
    return out
