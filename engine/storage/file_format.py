"""The disk tier's file format: one file per entry, its header, its trailer.

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

This module knows bytes and numpy arrays, never MLX: the cache manager's
start-up scan and `lineage cache` read headers with it, and every read opens
its file with `open_entry` (relative to the directory, no link, this user's
own file: checked on the open file). Writing a file
atomically is engine.storage.writer's; reading the directory is
engine.storage.directory's; turning a stored entry into arrays and back is
engine.storage.codec's. It decides nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.cache.kinds import Role
from engine.cache.messages import ENTRY_FORMAT_VERSION, EntryRecord

_ROLES = {r.value for r in Role}

log = logging.getLogger(__name__)

FORMAT_VERSION = ENTRY_FORMAT_VERSION
MAGIC = b"LNGCACHE"
END_MAGIC = b"LNGEND\0\0"
_PREFIX = struct.Struct("<8sIIII")
_TRAILER = struct.Struct("<8sQI")
ALIGN = 64
SUFFIX, DAMAGED_SUFFIX = ".entry", ".damaged"
_NAME = re.compile(r"^(\d+)\.(entry|damaged)$")
TEMP_NAME = re.compile(r"^\.(\d+)\.(\d+)\.tmp$")
_MAX_META = 64 << 20


class DamagedFile(Exception):
    """A file that must not be loaded; the message says why."""


def entries_dir(cache_dir: str | Path, mode: str = "lineage") -> Path:
    """Where the entry files live (``<cache_dir>/models/`` holds the embedded model).

    Exact mode (the baseline) keeps its whole-prompt snapshots apart, so a
    lineage server never matches them.
    """
    return Path(cache_dir) / ("entries" if mode == "lineage" else f"entries-{mode}")


def entry_name(entry_id: int) -> str:
    """The name of an entry's file in its directory.

    The model replica's writer and reader join it to the directory as strings
    (`os.path.join`), never `directory / name`: pathlib interns every part it
    parses, and a new name per file written, read or deleted churns the
    interpreter's table of interned strings until it resizes (see `file_id`)."""
    return f"{entry_id}{SUFFIX}"


def entry_file(directory: str | Path, entry_id: int) -> str:
    """An entry's file in `directory`, as a string (for the per-file paths: see entry_name)."""
    return os.path.join(directory, entry_name(entry_id))


def entry_path(directory: Path, entry_id: int) -> Path:
    return Path(directory) / entry_name(entry_id)


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

    @property
    def record(self) -> EntryRecord:
        """The entry as the cache policy's index describes it."""
        return EntryRecord(
            self.entry_id,
            self.namespace,
            self.role,
            self.tokens,
            self.prompt_len,
            self.checkpoints,
            self.kv_bytes_per_token,
            self.state_bytes,
        )


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
    ok = header.role in _ROLES and n > 0 and 0 < header.prompt_len <= n and int(meta["length"]) == n
    if not ok or any(not 0 < c < n for c, _ in checkpoints):
        raise DamagedFile("inconsistent header (lengths or role)")
    if file_bytes is not None and file_bytes != header.file_bytes:
        raise DamagedFile(
            f"truncated or padded: {file_bytes} bytes, header says {header.file_bytes}"
        )
    return header


def open_entry(directory: Path | int, name: str):
    """The file `name` of `directory` (its path, or an open descriptor of it), opened for
    reading, unbuffered, relative to the directory and never through a link.

    DamagedFile unless the open file (fstat) is a regular file of this user that
    no one else may read: another user's file, or one swapped in after the scan,
    is never loaded.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if isinstance(directory, int):
        fd = os.open(name, flags, dir_fd=directory)
    else:
        parent = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = os.open(name, flags, dir_fd=parent)
        finally:
            os.close(parent)
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "not a regular file"
    elif st.st_uid != os.getuid():
        problem = f"owned by uid {st.st_uid}"
    elif st.st_mode & 0o077:
        problem = f"mode {stat.S_IMODE(st.st_mode):o}: others may read it"
    if problem is not None:
        os.close(fd)
        raise DamagedFile(f"{name}: {problem}")
    return os.fdopen(fd, "rb", buffering=0)


def read_header(path: Path) -> Header:
    """Read and check one file's header (prefix, meta, tokens) only."""
    path = Path(path)
    with open_entry(path.parent, path.name) as f:
        header = read_header_from(f, os.fstat(f.fileno()).st_size)
    if header.entry_id != file_id(path):
        raise DamagedFile(f"header names entry {header.entry_id}")
    return header


def read_header_from(f, size: int) -> Header:
    """The header of an open file of `size` bytes, read from its start; DamagedFile if bad."""
    f.seek(0)
    prefix = f.read(_PREFIX.size)
    if len(prefix) == _PREFIX.size and prefix[:8] == MAGIC:
        _, _, meta_len, n_tokens, _ = _PREFIX.unpack(prefix)
        if meta_len <= _MAX_META:
            prefix += f.read(meta_len + 4 * n_tokens)
    return parse_header(prefix, size)


def file_id(path: str | Path) -> int | None:
    """The entry id an entry file's name carries (None: not an entry file's name).

    Read from the name as a string: a `Path` built per file interns its name in the
    interpreter's table of interned strings, and `file_sizes` (every `stats` read)
    would churn that table with every file name, growing it (a one-off 1.8 MiB step
    in a soak's cache manager)."""
    m = _NAME.match(os.path.basename(os.fspath(path)))
    return int(m.group(1)) if m else None


def _layout(arrays: list, dtypes: list) -> tuple[list, int]:
    table, offset = [], 0
    for view, dtype in zip(arrays, dtypes):
        table.append([dtype, list(view.shape), offset, int(view.nbytes)])
        offset = _align(offset + int(view.nbytes))
    return table, offset


def encode_header(
    meta: dict, tokens: np.ndarray, arrays: list, dtypes: list
) -> tuple[bytes, list, int]:
    """(header bytes padded to the body, array table, body bytes) of an entry's file."""
    table, body_bytes = _layout(arrays, dtypes)
    meta = dict(meta, arrays=table, body_bytes=body_bytes)
    blob = json.dumps(meta, separators=(",", ":")).encode()
    raw = np.asarray(tokens).astype("<i4").tobytes()
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(blob), len(tokens), 0)[:20]
    crc = zlib.crc32(raw, zlib.crc32(blob, zlib.crc32(head)))
    header = head + struct.pack("<I", crc) + blob + raw
    return header + b"\0" * (_align(len(header)) - len(header)), table, body_bytes


TRAILER_BYTES = _TRAILER.size


def encode_trailer(body_bytes: int, body_crc: int) -> bytes:
    """The bytes that end a file whose body is `body_bytes` long with checksum `body_crc`."""
    return _TRAILER.pack(END_MAGIC, body_bytes, body_crc)


READ_CHUNK = 8 << 20  # bytes per readinto + crc32 step of a body read


def body_steps(f, header: Header, targets: list):
    """Read the body of an open file into `targets` and check it (the array table, the
    trailer, the body's crc32; DamagedFile when any of them fails), one chunk (at most
    READ_CHUNK bytes) per step: yields the body bytes read so far after each, so whoever
    drives it can pause it or finish it on another thread (never two at once: the file
    position and the crc are the generator's).

    `targets` holds one writable C-contiguous buffer per array of the table, of
    its size (the caller allocates them where the arrays must live: the bytes
    go from the file straight there). `f` should be unbuffered (`buffering=0`):
    each chunk is then one `readinto` and one `zlib.crc32` over its own bytes,
    both of which run without the GIL, so a reader thread holds it only
    between chunks and the model loop keeps stepping meanwhile.
    """
    body_bytes = int(header.meta["body_bytes"])
    table = header.meta["arrays"]
    if len(targets) != len(table):
        raise DamagedFile("array table does not match the arrays")
    f.seek(header.body_offset)
    crc, pos = 0, 0
    for (_, _, offset, nbytes), target in zip(table, targets):
        view = memoryview(target).cast("B")
        if not pos <= offset <= body_bytes - nbytes or view.nbytes != nbytes:
            raise DamagedFile("array table out of bounds")
        if offset > pos:  # alignment padding
            crc = zlib.crc32(_read_exactly(f, bytearray(offset - pos)), crc)
        for start in range(0, nbytes, READ_CHUNK):
            crc = zlib.crc32(_read_exactly(f, view[start : start + READ_CHUNK]), crc)
            yield offset + min(nbytes, start + READ_CHUNK)
        pos = offset + nbytes
    if body_bytes > pos:
        crc = zlib.crc32(_read_exactly(f, bytearray(body_bytes - pos)), crc)
    magic, declared, expected = _TRAILER.unpack(_read_exactly(f, bytearray(_TRAILER.size)))
    if magic != END_MAGIC or declared != body_bytes:
        raise DamagedFile("bad trailer")
    if crc != expected:
        raise DamagedFile("body checksum mismatch")


def _read_exactly(f, buf):
    """`buf` filled from `f`'s position; DamagedFile when the file ends first."""
    view, done = memoryview(buf).cast("B"), 0
    while done < view.nbytes:
        n = f.readinto(view[done:])
        if not n:
            raise DamagedFile("truncated before the trailer")
        done += n
    return buf
