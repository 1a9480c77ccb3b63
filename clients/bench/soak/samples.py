"""What a soak samples every few seconds, one JSON line each.

A sample holds, at its time `t` (seconds since the soak began):

- `load`: the machine's load average (1, 5, 15 minutes): the machine is
  shared, and a time to first token carries its load;
- `processes`: per role of the serve (clients.bench.soak.serve: front end,
  each actor, raylet, GCS, Ray's helpers) its pid, RSS, open file descriptors
  and threads; of the RSS, `rss_file` is the pages mapped from files (its
  binary's and libraries' code, paged in as code paths first run, at most the
  files' size) and the rest its own memory (heap, stacks);
- `object_store_bytes`: bytes in Ray's object store;
- `disk`: the entry files in the cache directory (bytes, count, temporary
  files, quarantined ones) beside what the engine says its disk tier holds
  (`stats_bytes`, `stats_entries`, from CacheStats) and its RAM tier, and the
  bridge's stored Responses (`responses_bytes`, in the same directory);
- `logs`: the serve's log and its Ray session's logs, in bytes;
- `window`: the requests that ended since the previous sample: how many, time
  to first token p50 and p99, errors by kind, cached share (cached tokens over
  prompt tokens of those that completed), dropped streams;
- `reference_ms`: a fixed piece of MLX work timed in a child process of its
  own (clients.bench.soak.reference): the machine's speed at that time, which
  the report sets beside the drift of the time to first token (None where the
  child is gone);
- `replicas`: per model replica (the Inspect RPC, given one sampling interval)
  the compiled grammars it keeps and MLX's active bytes: bounded fills of the
  model actor's RSS that its own figures name ([] where it did not answer in
  time, as while a killed replica restarts);
- `probes`: probe replies checked and wrong so far; `fault`: the fault under
  way ("" for none).

The disk tier's counts are sampled side by side: the files are the truth of
what the disk holds, `stats_bytes` what the budget is held to, and (on an
engine that reports it) `stats_file_bytes` the engine's own sum of its files;
where they part for long, the budget does not hold the disk.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from clients.bench.figures import percentile


def read_processes(processes: dict) -> dict:
    import psutil

    out = {}
    for role, p in processes.items():
        try:
            with p.oneshot():
                memory = p.memory_info()
                out[role] = {
                    "pid": p.pid,
                    "rss": memory.rss,
                    # Linux (RssFile + RssShmem); None where psutil has no `shared` (macOS)
                    "rss_file": getattr(memory, "shared", None),
                    "fds": p.num_fds(),
                    "threads": p.num_threads(),
                }
        except psutil.Error:
            pass
    return out


def read_disk(entries: Path) -> dict:
    """The entry files of an entries directory: bytes, count, temporary and quarantined."""
    from engine.storage.file_format import DAMAGED_SUFFIX, SUFFIX, TEMP_NAME

    files = nbytes = temps = damaged = 0
    try:
        names = os.listdir(entries)
    except FileNotFoundError:
        names = []
    for name in names:
        try:
            size = os.path.getsize(entries / name)
        except OSError:
            continue
        if TEMP_NAME.match(name):
            temps += 1
        elif name.endswith(DAMAGED_SUFFIX):
            damaged += 1
        elif name.endswith(SUFFIX):
            files += 1
        else:
            continue
        nbytes += size
    return {"bytes": nbytes, "files": files, "temps": temps, "damaged": damaged}


def window(events: list) -> dict:
    done = [e for e in events if not e.error and not e.dropped]
    ttft = [e.ttft_ms for e in done]
    errors: dict[str, int] = {}
    for e in events:
        if e.error:
            errors[e.error] = errors.get(e.error, 0) + 1
    prompt = sum(e.prompt for e in done)
    return {
        "requests": len(events),
        "completed": len(done),
        "dropped": sum(e.dropped for e in events),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "errors": errors,
        "cached_share": sum(e.cached for e in done) / prompt if prompt else 0.0,
    }


class Sampler(threading.Thread):
    """Every `every` seconds, a sample of the soak, appended to `path` as a JSON line."""

    def __init__(self, soak, path: Path, every: float):
        super().__init__(name="soak-sampler", daemon=True)
        self.soak, self.path, self.every = soak, Path(path), every
        self.samples: list[dict] = []
        self.errors: list[str] = []  # samples that could not be taken, and why
        self._halt = threading.Event()
        self.reference = None  # clients.bench.soak.reference.Reference, while it runs

    def stop(self) -> None:
        self._halt.set()
        self.join(60)

    def run(self) -> None:
        from clients.bench.soak.reference import Reference

        self.reference = Reference()
        try:
            self._run()
        finally:
            self.reference.close()

    def _run(self) -> None:
        since = 0.0
        with self.path.open("a") as out:
            while not self._halt.wait(self.every):
                try:
                    sample = self.sample(since)
                except Exception as e:  # a sample that broke is a line saying so, not the end
                    self.errors.append(f"{type(e).__name__}: {e}")
                    continue
                since = sample["t"]
                self.samples.append(sample)
                out.write(json.dumps(sample) + "\n")
                out.flush()

    def sample(self, since: float) -> dict:
        soak = self.soak
        t = soak.log.now()
        stopping = soak.stopping.is_set()
        stats = {} if stopping else _stats(soak.client)
        replicas = [] if stopping else _replicas(soak.client, self.every)
        disk = read_disk(soak.entries)
        disk.update(
            responses_bytes=_tree_bytes(soak.cache_dir / "responses"),
            stats_bytes=stats.get("disk_bytes"),
            stats_entries=stats.get("disk_entries"),
            stats_file_bytes=stats.get("disk_file_bytes"),  # the engine's own read of the files
            ram_bytes=stats.get("ram_bytes"),
        )
        t0 = time.monotonic()
        processes = read_processes(soak.serve.processes())
        return {
            "t": round(t, 2),
            "load": os.getloadavg(),
            "processes": processes,
            "object_store_bytes": None
            if soak.stopping.is_set()
            else soak.serve.object_store_bytes(),
            "disk": disk,
            "logs": soak.serve.log_bytes(),
            "window": window(soak.log.since(since)),
            "replicas": replicas,
            "reference_ms": self.reference.time() if self.reference else None,
            "probes": {"checked": soak.probes.checked, "wrong": len(soak.probes.wrong)},
            "fault": soak.schedule.current if soak.schedule else "",
            "read_s": round(time.monotonic() - t0, 3),
        }


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def _stats(client) -> dict:
    try:
        return client.cache_stats()
    except Exception:
        return {}


def _replicas(client, within: float) -> list[dict]:
    """Each replica's compiled grammars held and MLX active bytes ([] when Inspect fails or
    takes over `within` s: it waits for every replica, and one restarting after a kill
    answers in its new life, while the sample's processes wait to be read)."""
    try:
        replicas = client.inspect(recent=0, timeout=within).get("replicas", [])
    except Exception:
        return []
    keys = ("name", "grammars_held", "mlx_active_bytes")
    return [{k: r.get(k, 0) for k in keys} for r in replicas]
