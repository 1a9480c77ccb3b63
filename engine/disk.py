"""The disk tier's files: format, the background writer thread, the header scan.

One file per entry (a conversation with its checkpoints, or an anchor), named
``<id>.entry`` in ``<cache_dir>/entries/``. Layout, little-endian:

    prefix   24 bytes  magic "LNGCACHE", u32 version, u32 meta_len, u32 n_tokens,
                       u32 header_crc (crc32 of the prefix's first 20 bytes + meta + tokens)
    meta     JSON      fingerprint, entry_id, namespace, role, length, prompt_len,
                       checkpoints [[n, kind]], kv_bytes_per_token, state_bytes,
                       created, body_bytes, arrays [[dtype, shape, offset, nbytes]],
                       layers and states: the entry's structure, arrays by index
    tokens   n_tokens int32
    body     at the next multiple of 64: each array's raw bytes at its offset
             (64-aligned; bfloat16 as its uint16 bits)
    trailer  20 bytes  "LNGEND\\0\\0", u64 body_bytes, u32 body_crc (crc32 of the body)

A start-up scan reads the prefix, meta and tokens of each file only (`scan`);
the body checksum is verified when a file is loaded (engine.store). A file
is written under a temporary name ``.<id>.<pid>.tmp``, fsynced, renamed, and
its directory fsynced, so a crash leaves either the whole file or a temporary
one that the next scan removes. A file that fails a check is never loaded: the
scan reports it, a load renames it to ``<id>.damaged``; `lineage cache prune`
removes both.

This module knows files and bytes (numpy arrays), never MLX: the cache
manager and `lineage cache` read headers with it. Turning a stored entry into
a write job and a file back into one is engine.store's (`capture`,
`load_entry`). It decides nothing: what to write or delete comes from the
cache manager's Orders.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import struct
import sys
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAGIC = b"LNGCACHE"
END_MAGIC = b"LNGEND\0\0"
_PREFIX = struct.Struct("<8sIIII")
_TRAILER = struct.Struct("<8sQI")
ALIGN = 64
SUFFIX, DAMAGED_SUFFIX = ".entry", ".damaged"
_NAME = re.compile(r"^(\d+)\.(entry|damaged)$")
_TEMP = re.compile(r"^\.(\d+)\.(\d+)\.tmp$")
_MAX_META = 64 << 20
ROLES = ("conversation", "anchor", "snapshot")  # snapshot: exact mode's whole prompts


class DamagedFile(Exception):
    """A file that must not be loaded; the message says why."""


def entries_dir(cache_dir: str | Path, mode: str = "lineage") -> Path:
    """Where the entry files live (``<cache_dir>/models/`` holds the embedded model).

    Exact mode (the baseline) keeps its whole-prompt snapshots apart, so a
    lineage server never matches them.
    """
    return Path(cache_dir) / ("entries" if mode == "lineage" else f"entries-{mode}")


def entry_path(directory: Path, entry_id: int) -> Path:
    return Path(directory) / f"{entry_id}{SUFFIX}"


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


# --- header --------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Header:
    """What a file says about its entry, read without its body."""

    version: int
    fingerprint: str
    entry_id: int
    namespace: str
    role: str
    tokens: np.ndarray  # int32
    prompt_len: int
    checkpoints: tuple[tuple[int, str], ...]
    kv_bytes_per_token: int
    state_bytes: int
    created: float
    body_offset: int
    file_bytes: int
    meta: dict = field(repr=False)

    @property
    def length(self) -> int:
        return len(self.tokens)


def parse_header(head: bytes | memoryview, file_bytes: int | None = None) -> Header:
    """The header at the start of `head` (which may hold more); DamagedFile if it fails a check.

    `file_bytes`: the file's size, checked against the size the header declares.
    """
    if len(head) < _PREFIX.size:
        raise DamagedFile("truncated before the end of the prefix")
    magic, version, meta_len, n_tokens, crc = _PREFIX.unpack_from(head)
    if magic != MAGIC:
        raise DamagedFile("not an entry file (bad magic)")
    if version != FORMAT_VERSION:
        raise DamagedFile(f"unknown format version {version}")
    end = _PREFIX.size + meta_len + 4 * n_tokens
    if meta_len > _MAX_META or len(head) < end:
        raise DamagedFile("truncated inside the header")
    body = memoryview(head)[_PREFIX.size : end]
    if zlib.crc32(body, zlib.crc32(memoryview(head)[:20])) != crc:
        raise DamagedFile("header checksum mismatch")
    try:
        meta = json.loads(bytes(body[:meta_len]))
        tokens = np.frombuffer(body[meta_len:], dtype="<i4").astype(np.int32)
        checkpoints = tuple((int(n), str(kind)) for n, kind in meta["checkpoints"])
        header = Header(
            version,
            str(meta["fingerprint"]),
            int(meta["entry_id"]),
            str(meta["namespace"]),
            str(meta["role"]),
            tokens,
            int(meta["prompt_len"]),
            checkpoints,
            int(meta["kv_bytes_per_token"]),
            int(meta["state_bytes"]),
            float(meta["created"]),
            _align(end),
            _align(end) + int(meta["body_bytes"]) + _TRAILER.size,
            meta,
        )
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedFile(f"unparseable header: {e}") from None
    n = header.length
    ok = header.role in ROLES and n > 0 and 0 < header.prompt_len <= n and int(meta["length"]) == n
    if not ok or any(not 0 < c < n for c, _ in checkpoints):
        raise DamagedFile("inconsistent header (lengths or role)")
    if file_bytes is not None and file_bytes != header.file_bytes:
        raise DamagedFile(
            f"truncated or padded: {file_bytes} bytes, header says {header.file_bytes}"
        )
    return header


def read_header(path: Path) -> Header:
    """Read and check one file's header (prefix, meta, tokens) only."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(_PREFIX.size)
        if len(prefix) == _PREFIX.size and prefix[:8] == MAGIC:
            _, _, meta_len, n_tokens, _ = _PREFIX.unpack(prefix)
            if meta_len <= _MAX_META:
                prefix += f.read(meta_len + 4 * n_tokens)
        header = parse_header(prefix, size)
    if header.entry_id != _file_id(path):
        raise DamagedFile(f"header names entry {header.entry_id}")
    return header


def _file_id(path: Path) -> int | None:
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else None


# --- scan ----------------------------------------------------------------------


@dataclass(frozen=True)
class ScannedFile:
    """One file of the directory: its header, or why it is damaged."""

    entry_id: int
    path: Path
    nbytes: int
    mtime: float
    header: Header | None
    problem: str | None = None


@dataclass(frozen=True)
class Scan:
    files: tuple[ScannedFile, ...]
    removed_temps: tuple[Path, ...]
    max_id: int  # the largest id of any file, temporary ones included (0: none)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def scan(directory: Path, remove_temps: bool = True) -> Scan:
    """Read every entry file's header; remove temporary files whose writer is gone.

    A temporary file of a live process (another server's writer, mid-write) is
    kept. Damaged files come back with `problem` set, never with a header.
    """
    directory = Path(directory)
    files, removed, max_id = [], [], 0
    if not directory.is_dir():
        return Scan((), (), 0)
    for path in sorted(directory.iterdir()):
        temp = _TEMP.match(path.name)
        if temp:
            max_id = max(max_id, int(temp.group(1)))
            pid = int(temp.group(2))
            if remove_temps and (pid == os.getpid() or not _alive(pid)):
                path.unlink(missing_ok=True)
                removed.append(path)
            continue
        entry_id = _file_id(path)
        if entry_id is None:
            continue
        max_id = max(max_id, entry_id)
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        header, problem = None, None
        if path.suffix == DAMAGED_SUFFIX:
            problem = "quarantined after a failed load"
        else:
            try:
                header = read_header(path)
            except DamagedFile as e:
                problem = str(e)
            except OSError as e:
                problem = f"unreadable: {e}"
        files.append(ScannedFile(entry_id, path, st.st_size, st.st_mtime, header, problem))
    return Scan(tuple(files), tuple(removed), max_id)


def delete_files(directory: Path, entry_id: int) -> int:
    """Remove an entry's file (and a quarantined copy); the bytes freed."""
    freed = 0
    for suffix in (SUFFIX, DAMAGED_SUFFIX):
        path = Path(directory) / f"{entry_id}{suffix}"
        try:
            freed += path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            pass
    return freed


# --- writer ----------------------------------------------------------------------


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


@dataclass
class WriterStats:
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    dropped: int = 0  # superseded before the write started
    failed: int = 0
    deleted: int = 0

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["mb_per_s"] = self.bytes / self.seconds / 1e6 if self.seconds else 0.0
        return out


def _layout(job: WriteJob) -> tuple[list, int]:
    table, offset = [], 0
    for view, dtype in zip(job.arrays, job.dtypes):
        table.append([dtype, list(view.shape), offset, int(view.nbytes)])
        offset = _align(offset + int(view.nbytes))
    return table, offset


def encode_header(job: WriteJob) -> tuple[bytes, list, int]:
    """(header bytes padded to the body, array table, body bytes) of a job."""
    table, body_bytes = _layout(job)
    meta = dict(job.meta, arrays=table, body_bytes=body_bytes)
    blob = json.dumps(meta, separators=(",", ":")).encode()
    tokens = job.tokens.astype("<i4").tobytes()
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(blob), len(job.tokens), 0)[:20]
    crc = zlib.crc32(tokens, zlib.crc32(blob, zlib.crc32(head)))
    header = head + struct.pack("<I", crc) + blob + tokens
    return header + b"\0" * (_align(len(header)) - len(header)), table, body_bytes


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
    """Write one entry file atomically (temporary name, fsync, rename, fsync dir); its bytes."""
    directory = Path(directory)
    tmp = directory / f".{job.entry_id}.{os.getpid()}.tmp"
    header, table, body_bytes = encode_header(job)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
        _write_all(fd, b"\0" * pad + _TRAILER.pack(END_MAGIC, body_bytes, crc))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, entry_path(directory, job.entry_id))
    _fsync_dir(directory)
    return len(header) + body_bytes + _TRAILER.size


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lower_priority() -> None:
    """Nice the calling thread (Linux only: there nice is per thread), so decode wins a
    contended CPU."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


class DiskWriter:
    """A background thread that writes and deletes files in the order they were asked for.

    A write not yet started when its entry's file is deleted is dropped (the
    entry was superseded or evicted); a delete of a file being written runs
    after that write. Generation never waits on it.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.stats = WriterStats()
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, int]] = deque()
        self._pending: dict[int, WriteJob] = {}
        self._current: WriteJob | None = None  # the write under way
        self._busy = False  # an operation is under way
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="disk-writer", daemon=True)
        self._thread.start()

    def write(self, job: WriteJob) -> None:
        with self._cond:
            self._pending[job.entry_id] = job
            self._queue.append(("write", job.entry_id))
            self._cond.notify_all()

    def delete(self, entry_id: int) -> None:
        with self._cond:
            if self._pending.pop(entry_id, None) is not None:
                self.stats.dropped += 1
            else:
                self._queue.append(("delete", entry_id))
            self._cond.notify_all()

    def held(self, entry_id: int) -> WriteJob | None:
        """The queued or running write of this entry, if any."""
        with self._cond:
            job = self._pending.get(entry_id)
            current = self._current
        return job or (current if current is not None and current.entry_id == entry_id else None)

    @property
    def backlog(self) -> tuple[int, int]:
        """(queued operations, bytes of queued writes)."""
        with self._cond:
            return len(self._queue) + self._busy, sum(j.nbytes for j in self._pending.values())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything asked so far is on disk; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> bool:
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        return done

    def _run(self) -> None:
        _lower_priority()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                op, entry_id = self._queue.popleft()
                job = self._pending.pop(entry_id, None) if op == "write" else None
                self._current, self._busy = job, True
            try:
                if op == "delete":
                    delete_files(self.directory, entry_id)
                    self.stats.deleted += 1
                elif job is not None:
                    t0 = time.perf_counter()
                    nbytes = write_file(self.directory, job)
                    self.stats.seconds += time.perf_counter() - t0
                    self.stats.files += 1
                    self.stats.bytes += nbytes
            except Exception:  # the writer must outlive one bad file (disk full, ...)
                self.stats.failed += 1
                log.exception("disk tier: %s of entry %d failed", op, entry_id)
            finally:
                with self._cond:
                    self._current, self._busy = None, False
                    self._cond.notify_all()
