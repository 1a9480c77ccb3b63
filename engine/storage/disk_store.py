"""The disk tier's tensor side: entry files written off the hot path, read back into RAM.

An order to write captures the entry as numpy views over its arrays (no copy
on the loop thread; the arrays are immutable) and queues it; the writer
thread copies and writes it. A plan that restores from a file
(`RestorePlan.load_from_disk`) is read into RAM before admission, on the
RAM tier's reader thread (`read`: the file read straight into MLX buffers and
checked, without the GIL, at idle priority; a read that idle priority starves
is done again on a niced thread) and finished on the loop's (`finish`: the stored
forms rebuilt), paid once per file.
It obeys the cache manager's Orders; it decides nothing. Writes that never
reach the disk (the writer's queue was full, the disk was) are `take_lost()`:
whoever holds the store tells the cache manager, whose disk index forgets them;
files written are `take_written()`: the manager lets other replicas of the
machine read them from then on.

Every entry it hands back carries the token ids it covers, checked against
the plan's (a file's header tokens, a queued write's record): a file or a
queued write that holds other tokens than the plan's is never loaded.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from engine.cache.messages import EntryRecord
from engine.config import EngineConfig
from engine.runtime.tier.ram import StoredEntry
from engine.storage import file_format
from engine.storage.codec import drain, finish_entry, read_steps, to_write_job
from engine.storage.writer import DiskWriter, lower_priority

log = logging.getLogger(__name__)

# A read at idle priority found below this rate (the CPU it needs goes to busier
# threads: decoding, other processes), checked every LATE_AFTER_S, is read on the late
# thread instead. The rate counts `read_steps`' bytes done: each array's allocation and
# then its bytes read, so about twice the body's bytes over a whole load.
LATE_AFTER_S = 0.25
LATE_MIN_BYTES_PER_S = 200e6


class _TakenOver(Exception):
    """The late thread took the read over: the reader stops."""


class _Progress:
    """One read, shared by the reader (`run`) and the late thread's watch; `result` ends
    with the read of whichever of them does it."""

    def __init__(self, result: Future) -> None:
        self.result = result
        self.lock = threading.Lock()
        self.ended = threading.Event()  # the reader is done (its read, stopped, or skipped)
        self.done = 0  # bytes of the read done so far
        self.taken = False  # the late thread reads it
        self.finished = False  # the reader's read is the one returned

    def run(self, steps):
        """Run a read's steps on the reader until they end or the late thread takes over."""
        try:
            while True:
                if self.taken:
                    steps.close()
                    raise _TakenOver
                self.done = next(steps)
        except StopIteration as stop:
            return stop.value


class DiskStore:
    """Files of one model fingerprint: writes through the writer thread, loads on the caller's."""

    def __init__(
        self,
        directory: str | Path,
        fingerprint: str,
        max_queued_bytes: int | None = None,
        late_after: float = LATE_AFTER_S,
        late_rate: float = LATE_MIN_BYTES_PER_S,
    ) -> None:
        self.directory = Path(directory)
        self.fingerprint = fingerprint
        self.writer = DiskWriter(self.directory, max_queued_bytes)
        # Loads open files relative to the directory as it is now (checked by the
        # writer's private_directory), never through a path swapped later.
        self.dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # The late thread reads what the idle-priority reader cannot get CPU for. It is
        # started here, on the constructing thread: a thread inherits its creator's
        # policy, and one born of the SCHED_IDLE reader could never leave it unprivileged.
        self.late_after, self.late_rate = late_after, late_rate
        self._late = ThreadPoolExecutor(1, thread_name_prefix="disk-reader-late")
        self._late.submit(lower_priority).result()
        self._reader: ThreadPoolExecutor | None = None  # the idle-priority reader, on first use
        self.late_loads = 0
        self.loads = 0
        self.load_failures = 0
        self.load_bytes = 0
        self.load_seconds = 0.0

    def write(self, entry: StoredEntry, record: EntryRecord) -> None:
        """Queue the entry's file; ValueError when the entry does not match its record."""
        self.writer.write(to_write_job(entry, record, self.fingerprint))

    def skip(self, record: EntryRecord) -> None:
        """A write ordered that will not be done (the entry is not held here, or does not
        match its record): reported lost, so the disk index forgets the file."""
        self.writer.skip(record.entry_id, record.supersedes)

    def delete(self, entry_id: int) -> None:
        self.writer.delete(entry_id)

    def take_lost(self) -> list[int]:
        """Ids of writes lost since the last call (their files do not exist)."""
        return self.writer.take_lost()

    def take_written(self) -> list[tuple[int, int]]:
        """(id, bytes) of the files written since the last call (durable)."""
        return self.writer.take_written()

    def take_resumed(self) -> bool:
        """Whether writing resumed after a full disk since the last call (writes were given
        up meanwhile: DiskWriter.take_resumed)."""
        return self.writer.take_resumed()

    @property
    def on_report(self):
        return self.writer.on_report

    @on_report.setter
    def on_report(self, callback) -> None:
        """Runs (on the writer's thread, or the caller's) when writes were lost or files
        written (`take_lost`, `take_written`)."""
        self.writer.on_report = callback

    def load(self, entry_id: int, namespace: str | None = None, tokens=None) -> StoredEntry | None:
        """The entry from its queued write or its file, read on the caller's thread at its
        priority; None (logged) when missing or damaged.

        A file must hold `namespace` and start with `tokens` (the plan's), when given.
        """
        return self.finish(self._read(entry_id, drain), namespace, tokens)

    def start_read(self, entry_id: int) -> Future:
        """Begin the part of a load that runs off the model loop (the read into MLX buffers,
        the checks) on the reader thread; a Future of what `finish` takes, on the loop.

        The reader is SCHED_IDLE: decoding wins the CPU. The late thread watches
        it from the start: a read found under LATE_MIN_BYTES_PER_S (every
        LATE_AFTER_S; the CPU went to busier threads, decoding or other
        processes) is read there instead, niced like the writer, and the reader
        drops it at its next step (or never starts it). So a waiting request is
        served however busy the CPU is.
        """
        if self._reader is None:  # started here, like the late thread, with its policy
            self._reader = ThreadPoolExecutor(
                1, thread_name_prefix="disk-reader", initializer=_background
            )
        progress = _Progress(Future())
        self._reader.submit(self._read_idle, entry_id, progress)
        self._late.submit(self._watch, entry_id, progress)
        return progress.result

    def _read_idle(self, entry_id: int, progress: _Progress) -> None:
        """On the reader thread: the read, unless the late thread has taken it."""
        try:
            result = self._read(entry_id, progress.run)
        except _TakenOver:
            result = None
        except BaseException as e:  # the Future must end whatever happens
            result = (entry_id, None, e, 0.0)
        with progress.lock:
            mine = not progress.taken
            progress.finished = mine
        progress.ended.set()
        if mine:
            progress.result.set_result(result)

    def _read(self, entry_id: int, run):
        job = self.writer.held(entry_id)
        if job is not None:
            return entry_id, job, None, 0.0
        path = file_format.entry_file(self.directory, entry_id)
        t0 = time.perf_counter()
        try:
            steps = read_steps(path, self.fingerprint, entry_id, self.dir_fd)
            return entry_id, None, run(steps), t0
        except (file_format.DamagedFile, OSError) as e:
            return entry_id, None, e, t0

    def _watch(self, entry_id: int, progress: _Progress) -> None:
        """On the late thread: nothing once the reader ends its read; the read done here
        instead when the reader falls behind the rate."""
        t0 = time.perf_counter()
        while not progress.ended.wait(self.late_after):
            elapsed = time.perf_counter() - t0
            with progress.lock:
                if progress.finished or progress.done >= self.late_rate * elapsed:
                    continue
                progress.taken = True
            self.late_loads += 1
            log.info(
                "disk tier: the reader did %.1f MB (allocated + read) of entry %d in %.2f s at "
                "idle priority; "
                "reading it on the late thread",
                progress.done / 1e6,
                entry_id,
                elapsed,
            )
            try:
                result = self._read(entry_id, drain)
            except BaseException as e:
                result = (entry_id, None, e, 0.0)
            progress.result.set_result(result)
            return

    def finish(self, read, namespace: str | None = None, tokens=None) -> StoredEntry | None:
        """The entry of a `read`; None (logged, a damaged file renamed) when it failed or
        does not hold `namespace` and `tokens` (the plan's), when given."""
        entry_id, job, result, t0 = read
        if job is not None:  # still queued here: the write's record says what it holds
            held = job.entry
            if namespace is not None and job.meta["namespace"] != namespace:
                log.error("disk tier: queued entry %d is of another namespace", entry_id)
                return None
            if tokens is not None and not np.array_equal(held.tokens[: len(tokens)], tokens):
                log.error("disk tier: queued entry %d holds other tokens than planned", entry_id)
                return None
            return StoredEntry(held.layers, held.length, dict(held.states), tokens=held.tokens)
        name = file_format.entry_name(entry_id)  # no Path: see entry_name
        try:
            if isinstance(result, BaseException):
                raise result
            entry, nbytes = finish_entry(result, namespace, tokens)
        except FileNotFoundError:
            log.warning("disk tier: file of entry %d is missing; prefilling cold", entry_id)
        except (file_format.DamagedFile, OSError) as e:
            log.error(
                "disk tier: %s is damaged (%s); not loaded, renamed to %s",
                os.path.join(self.directory, name),
                e,
                file_format.DAMAGED_SUFFIX,
            )
            try:
                damaged = f"{entry_id}{file_format.DAMAGED_SUFFIX}"
                os.replace(name, damaged, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            except OSError:
                pass
        else:
            self.loads += 1
            self.load_bytes += nbytes
            self.load_seconds += time.perf_counter() - t0
            try:
                # the disk tier's LRU survives restarts through mtimes
                os.utime(name, dir_fd=self.dir_fd, follow_symlinks=False)
            except OSError:
                pass
            return entry
        self.load_failures += 1
        return None

    def flush(self, timeout: float | None = None) -> bool:
        return self.writer.flush(timeout)

    def max_queued_id(self) -> int:
        return self.writer.max_queued_id()

    def queued(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The writer's queued writes and deletes (DiskWriter.queued)."""
        return self.writer.queued()

    def close(self, timeout: float | None = None) -> bool:
        self._late.shutdown(wait=False)
        if self._reader is not None:
            self._reader.shutdown(wait=False)
        closed = self.writer.close(timeout)
        os.close(self.dir_fd)
        return closed

    def stats(self) -> dict:
        queued, queued_bytes = self.writer.backlog
        return {
            "writer": self.writer.stats.as_dict(),
            "queued": queued,
            "queued_bytes": queued_bytes,
            "paused_s": self.writer.paused_s,  # > 0: writes are given up (the disk was full)
            "loads": self.loads,
            "load_bytes": self.load_bytes,
            "load_failures": self.load_failures,
            "late_loads": self.late_loads,
            "load_mb_per_s": self.load_bytes / self.load_seconds / 1e6
            if self.load_seconds
            else 0.0,
        }


def _background() -> None:
    """Schedule the calling thread (the reader) as background work: decode wins the CPU.

    Linux's SCHED_IDLE runs it in what decoding leaves (decode's own threads
    preempt it at once; nice alone still left decode's inter-token p99 at twice
    its idle value in bench restart), and the thread MLX starts for this
    thread's stream inherits it. Where nothing is left (every core busy) it
    gets next to nothing, hence the late thread (`DiskStore._watch`). Elsewhere
    this does nothing (per-thread priorities are Linux's).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def open_disk_store(config: EngineConfig, fingerprint: str) -> DiskStore | None:
    """The disk tier's store (and writer thread) of this model, or None when it is off."""
    cache = config.cache
    if cache.mode == "off" or cache.disk_budget <= 0:
        return None
    directory = file_format.entries_dir(cache.resolved_cache_dir, cache.mode)
    try:
        return DiskStore(directory, fingerprint, cache.disk_queue_cap)
    except PermissionError as e:  # another user's directory, or a link: never write there
        log.error("disk tier off: %s", e)
        return None
