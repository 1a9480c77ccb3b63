"""The disk tier's writer: a background thread that writes and deletes entry files.

A file is written under a temporary name ``.<id>.<pid>.tmp`` (created
O_EXCL|O_NOFOLLOW, mode 0600, in a 0700 directory), fsynced, renamed, and its
directory fsynced, so a crash leaves either the whole file
or a temporary one that the next scan removes. What to write comes as a
WriteJob (numpy views captured by engine.storage.codec); what to write or
delete, and when, comes from the cache manager's Orders.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import sys
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.storage.directory import delete_files, private_directory, remove_file
from engine.storage.file_format import TRAILER_BYTES, encode_header, encode_trailer, entry_file

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WriteJob:
    """An entry captured for writing: numpy views over its (immutable) arrays."""

    entry_id: int
    meta: dict  # everything but body_bytes, arrays
    tokens: np.ndarray
    arrays: list  # numpy views, rows already cut to the entry's length
    dtypes: list  # dtype name per array ("bfloat16" for uint16 bits)
    entry: Any = None  # the captured StoredEntry: a load while the job is queued reads it
    nbytes: int = 0
    supersedes: tuple = ()  # entry ids whose files go once this one is durable


@dataclass
class WriterStats:
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    dropped: int = 0  # superseded before the write started
    failed: int = 0
    deleted: int = 0
    refused: int = 0  # not queued: the queue held its byte cap
    no_space: int = 0  # given up on a full disk (ENOSPC), or while writing paused after one
    skipped: int = 0  # never queued: the entry was not held, or did not match its record

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["mb_per_s"] = self.bytes / self.seconds / 1e6 if self.seconds else 0.0
        return out


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _blocks(view: np.ndarray, most: int = 4096):
    """C-contiguous pieces of `view` in order, written without a copy where they are few.

    A stored KV array is rows [:n] of a longer buffer: each (head) plane is
    contiguous, the whole is not. Copying it would hold the GIL for the copy;
    writing its planes one by one lets the loop thread run meanwhile.
    """
    if view.size == 0:
        return
    if view.flags.c_contiguous:
        yield view
        return
    for k in range(1, view.ndim):
        lead = int(np.prod(view.shape[:k]))
        if lead > most:
            break
        if view[(0,) * k].flags.c_contiguous:
            for index in np.ndindex(*view.shape[:k]):
                yield view[index]
            return
    yield np.ascontiguousarray(view)


def write_file(directory: Path, job: WriteJob) -> int:
    """Write one entry file atomically (temporary name, fsync, rename, fsync dir); its bytes.

    Its paths are strings, not `Path`s: see file_format.entry_name."""
    directory = os.fspath(directory)
    tmp = os.path.join(directory, f".{job.entry_id}.{os.getpid()}.tmp")
    header, table, body_bytes = encode_header(job.meta, job.tokens, job.arrays, job.dtypes)
    remove_file(tmp)  # a leftover of this pid's predecessor (or a planted link)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        _write_all(fd, header)
        crc, written = 0, 0
        for view, (_, _, offset, nbytes) in zip(job.arrays, table):
            pad = offset - written
            if pad:
                crc = zlib.crc32(b"\0" * pad, crc)
                _write_all(fd, b"\0" * pad)
            for block in _blocks(view):
                crc = zlib.crc32(memoryview(block).cast("B"), crc)
                _write_all(fd, block)
            written = offset + nbytes
        pad = body_bytes - written
        crc = zlib.crc32(b"\0" * pad, crc)
        _write_all(fd, b"\0" * pad + encode_trailer(body_bytes, crc))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        remove_file(tmp)
        raise
    os.close(fd)
    os.replace(tmp, entry_file(directory, job.entry_id))
    _fsync_dir(directory)
    return len(header) + body_bytes + TRAILER_BYTES


def _fsync_dir(directory: str | Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lower_priority() -> None:
    """Nice the calling thread (Linux only: there nice is per thread), so decode wins a
    contended CPU."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
BACKOFF_S = (1.0, 60.0)  # the first and the longest pause of writing after a full disk
REPORT_EVERY = 16  # written files reported at once while the queue stays busy


class DiskWriter:
    """A background thread that writes and deletes files in the order they were asked for.

    A write not yet started when its entry's file is deleted is dropped (the
    entry was superseded or evicted); a delete of a file being written runs
    after that write. A write that supersedes other files (an absorbed
    source's) deletes them once it is durable. Generation never waits on it.

    Backpressure: queued writes hold at most `max_queued_bytes` (numpy views
    that keep their arrays alive, a spilled entry's beyond the RAM budget); a
    write past the cap is refused, unless the queue is empty. A full disk
    (ENOSPC, EDQUOT) pauses writing, the pause doubling from `backoff[0]` up to
    `backoff[1]` while the disk stays full; writes that come due meanwhile are
    given up, and deletes still run (they free space). A write that does not
    reach the disk (refused, given up, failed) is *lost*: the files it
    superseded go too (the index forgot them when it ordered the write), and
    its id is reported by `take_lost()`, so the disk index forgets a file that
    does not exist. A written file is reported by `take_written()` with its
    bytes (durable: any reader of the directory finds it now), a few at a time:
    when the queue runs dry, or every REPORT_EVERY files. `on_report` runs when
    there is something to take.
    """

    def __init__(
        self,
        directory: Path,
        max_queued_bytes: int | None = None,
        backoff: tuple[float, float] = BACKOFF_S,
        on_report: Callable[[], None] | None = None,
    ) -> None:
        self.directory = private_directory(Path(directory))
        self.max_queued_bytes = max_queued_bytes
        self.backoff = backoff
        self.on_report = on_report
        self.stats = WriterStats()
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, int]] = deque()
        self._pending: dict[int, WriteJob] = {}
        self._queued_bytes = 0  # of the writes in _pending
        self._lost: list[int] = []  # ids whose write did not reach the disk, not taken yet
        self._written: list[tuple[int, int]] = []  # (id, bytes) of durable files, not taken
        self._pause = backoff[0]  # the next pause after a full disk
        self._paused_until = 0.0  # monotonic time: writes before it are given up
        self._gave_up = False  # writes were given up to a full disk since the last one done
        self._resumed = False  # the pause after them ended: reported, not taken yet
        self._current: WriteJob | None = None  # the write under way
        self._busy = False  # an operation is under way
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="disk-writer", daemon=True)
        self._thread.start()

    def write(self, job: WriteJob) -> bool:
        """Queue the write; False (the write lost) when the queue holds its byte cap."""
        with self._cond:
            cap = self.max_queued_bytes
            if cap is not None and self._pending and self._queued_bytes + job.nbytes > cap:
                self.stats.refused += 1
                queued = self._queued_bytes
                self._lose(job)
                # Unindexed since the write was ordered: they go, as for a dropped write.
                self._queue.extend(("delete", old) for old in job.supersedes)
                self._cond.notify_all()
                refused = True
            else:
                old = self._pending.pop(job.entry_id, None)
                if old is not None:
                    self._queued_bytes -= old.nbytes
                self._pending[job.entry_id] = job
                self._queued_bytes += job.nbytes
                self._queue.append(("write", job.entry_id))
                self._cond.notify_all()
                refused = False
        if refused:
            log.warning(
                "disk tier: write of entry %d (%d bytes) refused: %d bytes queued, cap %d",
                job.entry_id,
                job.nbytes,
                queued,
                cap,
            )
            self._report()
        return not refused

    def delete(self, entry_id: int) -> None:
        with self._cond:
            dropped = self._pending.pop(entry_id, None)
            if dropped is not None:
                self._queued_bytes -= dropped.nbytes
                self.stats.dropped += 1
                # Never written: the files it was to replace go now (nothing indexes them).
                self._queue.extend(("delete", old) for old in dropped.supersedes)
            else:
                self._queue.append(("delete", entry_id))
            self._cond.notify_all()

    def take_lost(self) -> list[int]:
        """Ids whose write was lost since the last call: their files do not exist."""
        with self._cond:
            lost, self._lost = self._lost, []
        return lost

    def skip(self, entry_id: int, supersedes=()) -> None:
        """A write ordered but never queued (its entry was not held, or did not match its
        record): lost like a refused one, and the files it was to replace go."""
        with self._cond:
            self.stats.skipped += 1
            self._lost.append(entry_id)
            self._queue.extend(("delete", old) for old in supersedes)
            self._cond.notify_all()
        self._report()

    def take_written(self) -> list[tuple[int, int]]:
        """(id, bytes) of the files written (and durable) since the last call."""
        with self._cond:
            written, self._written = self._written, []
        return written

    def held(self, entry_id: int) -> WriteJob | None:
        """The queued or running write of this entry, if any."""
        with self._cond:
            job = self._pending.get(entry_id)
            current = self._current
        return job or (current if current is not None and current.entry_id == entry_id else None)

    def queued(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(ids of the writes queued or under way, ids of the files to be deleted: queued
        deletes, and the files those writes supersede): what the directory does not show
        yet."""
        with self._cond:
            jobs = list(self._pending.values())
            if self._current is not None:
                jobs.append(self._current)
            deletes = [i for op, i in self._queue if op == "delete"]
        deletes += [old for job in jobs for old in job.supersedes]
        return tuple(job.entry_id for job in jobs), tuple(deletes)

    def max_queued_id(self) -> int:
        """The largest entry id of a queued or running write (0: none)."""
        with self._cond:
            ids = list(self._pending)
            if self._current is not None:
                ids.append(self._current.entry_id)
        return max(ids, default=0)

    @property
    def backlog(self) -> tuple[int, int]:
        """(queued operations, bytes of queued writes)."""
        with self._cond:
            return len(self._queue) + self._busy, self._queued_bytes

    @property
    def paused(self) -> bool:
        """Writing pauses after a full disk."""
        return time.monotonic() < self._paused_until

    @property
    def paused_s(self) -> float:
        """Seconds left of the pause after a full disk (0: writing)."""
        return max(0.0, self._paused_until - time.monotonic())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything asked so far is on disk (or lost); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> bool:
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        return done

    def _resume_due(self) -> bool:
        """Writes were given up to a full disk and the pause is over (call holding the lock)."""
        return self._gave_up and not self.paused

    def take_resumed(self) -> bool:
        """Whether a pause after a full disk ended since the last call, with writes given up
        meanwhile: the entries they were for may be ordered written again."""
        with self._cond:
            resumed, self._resumed = self._resumed, False
        return resumed

    def _run(self) -> None:
        lower_priority()
        while True:
            with self._cond:
                idle = lambda: self._queue or self._closed or self._resume_due()  # noqa: E731
                # While writes are given up, it wakes when the pause ends, queue or not.
                self._cond.wait_for(idle, self.paused_s + 0.01 if self._gave_up else None)
                resumed = not self._queue and self._resume_due()
                if resumed:
                    self._gave_up, self._resumed = False, True
                elif not self._queue:
                    if self._closed:
                        return
                    continue
                else:
                    op, entry_id = self._queue.popleft()
                    job = self._pending.pop(entry_id, None) if op == "write" else None
                    if job is not None:
                        self._queued_bytes -= job.nbytes
                    self._current, self._busy = job, True
            if resumed:
                self._report()
                continue
            lost, wrote = False, 0  # wrote: the bytes of the file written
            try:
                if op == "delete":
                    delete_files(self.directory, entry_id)
                    self.stats.deleted += 1
                elif job is not None and self.paused:  # the disk was full a moment ago
                    self.stats.no_space += 1
                    lost = self._gave_up = True
                elif job is not None:
                    wrote = self._write(job)
            except OSError as e:
                lost = op == "write"
                if lost and e.errno in NO_SPACE:
                    self.stats.no_space += 1
                    self._gave_up = True
                    self._paused_until = time.monotonic() + self._pause
                    log.error(
                        "disk tier: the disk is full (writing entry %d); writes pause %.1f s",
                        entry_id,
                        self._pause,
                    )
                    self._pause = min(2 * self._pause, self.backoff[1])
                else:
                    self.stats.failed += 1
                    log.exception("disk tier: %s of entry %d failed", op, entry_id)
            except Exception:  # the writer must outlive one bad file
                lost = op == "write"
                self.stats.failed += 1
                log.exception("disk tier: %s of entry %d failed", op, entry_id)
            if lost:
                for old in job.supersedes:  # unindexed since the write was ordered
                    self._delete_quietly(old)
            with self._cond:
                if lost:
                    self._lose(job)
                if wrote:
                    self._written.append((job.entry_id, wrote))
                batch = not self._queue or len(self._written) >= REPORT_EVERY
                report = lost or (bool(self._written) and batch)
                self._current, self._busy = None, False
                self._cond.notify_all()
            if report:
                self._report()

    def _write(self, job: WriteJob) -> int:
        """Write the job's file; its bytes."""
        t0 = time.perf_counter()
        nbytes = write_file(self.directory, job)
        self.stats.seconds += time.perf_counter() - t0
        self.stats.files += 1
        self.stats.bytes += nbytes
        self._pause = self.backoff[0]  # the disk takes writes again
        self._gave_up = False
        for old in job.supersedes:  # only now that the successor is durable
            self._delete_quietly(old)
        return nbytes

    def _delete_quietly(self, entry_id: int) -> None:
        try:
            delete_files(self.directory, entry_id)
            self.stats.deleted += 1
        except OSError:
            self.stats.failed += 1
            log.exception("disk tier: delete of entry %d failed", entry_id)

    def _lose(self, job: WriteJob) -> None:
        """Record a write that will not reach the disk (call holding the lock)."""
        self._lost.append(job.entry_id)

    def _report(self) -> None:
        if self.on_report is not None:
            try:
                self.on_report()
            except Exception:
                log.exception("disk tier: reporting lost or written files failed")
