"""Stored Responses (`store`): each response's conversation, per tenant, bounded, on disk.

A stored response keeps the Response object `GET /v1/responses/{id}` returns and
its conversation as the engine renders it (the input's messages and the reply,
without the instructions), so a follow-up naming it as `previous_response_id`
sends only its new items. Each record is self-contained (evicting one never
breaks another) and is one file `<id>.json` in a private directory (0700, files
0600) under the cache directory, written atomically (a temporary name, fsync,
rename) by one writer thread, so a restart keeps them. The bounds are a count
and bytes; the least recently used record goes first, and leaves a tombstone
(`<id>.evicted`, bounded as well) so that its tenant's next look-up says it was
evicted. A file's first line names its id and tenant (a digest), so a start reads
only that line of each. A record is read only by its own tenant: another tenant's id, like an
unknown one, is a `StoredNotFound` that says nothing more. The most recently
used records (`MEMORY_RECORDS`, at most `MEMORY_BYTES` of their files) are also
kept in memory as their files' bytes, one immutable block each, and parsed on
each use by the same function that parses a file: a conversation that goes on is
read from disk only after a restart or a long pause, the tier costs its files'
bytes and no more, and each `get` returns a record of its own (~0.15 ms to parse
an agent's 30 turns, 58 KB). The rest live on disk alone, so the process holds a
few hundred records whatever the bounds on disk, and an index of ~300 bytes a
record (its id, size and tenant, one string per tenant) and ~170 a tombstone:
~4.6 MiB at the default 10,000 of each. Without a directory the store
lives in memory only, as the same bytes, held to its own bounds.
It knows files and JSON; nothing of HTTP or the engine.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ID = re.compile(r"resp_[0-9a-f]{32}")
# Records kept in memory beside their files, as the files' bytes: the latest turns of the
# conversations going on. 256 agent records of 58 KB (30 turns each) hold 14.9 MB, and the
# process grows by 15 MB; held parsed, the same records grew it by 32 MB (17 MB of Python
# objects: many small dicts and strings), and with the engine messages built for each (their
# buffers outside Python's heap) by 59 MB. Kept 64 MB of files parsed, it grew for hours.
MEMORY_RECORDS = 256
MEMORY_BYTES = 16 << 20


class StoredNotFound(LookupError):
    """No stored response of that id for this tenant (or it was evicted: `evicted`)."""

    def __init__(self, response_id: str, evicted: bool = False):
        reason = (
            "was evicted from the response store (its bounds: --responses-max, "
            "--responses-max-bytes)"
            if evicted
            else "was not found"
        )
        super().__init__(f"response {response_id!r} {reason}")
        self.evicted = evicted


@dataclass(frozen=True)
class Record:
    """One stored response: the object GET returns, and its conversation."""

    id: str
    tenant: str  # a digest of the tenant, never the tenant itself
    response: dict
    conversation: tuple[dict, ...]  # engine messages, input and reply, no instructions
    calls: tuple[str, ...] = ()  # the ids of the reply's tool calls (its text holds them)


def tenant_key(tenant: str) -> str:
    return hashlib.sha256(("lineage-responses\0" + tenant).encode()).hexdigest()


class ResponseStore:
    """Records by id, bounded by count and bytes, in a directory or in memory."""

    def __init__(self, directory: str | Path | None, max_count: int, max_bytes: int):
        self.directory = Path(directory) if directory else None
        self.max_count, self.max_bytes = max_count, max_bytes
        self._lock = threading.Lock()
        self._sizes: collections.OrderedDict[str, tuple[str, int]] = collections.OrderedDict()
        self._tombstones: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._memory: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._memory_bytes = 0
        self.bytes = 0
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="response-store")
        if self.directory is not None:
            self._open()

    # ------------------------------------------------------------ reading ----

    def get(self, tenant: str, response_id: str) -> Record:
        """The tenant's record of that id; StoredNotFound otherwise."""
        key = tenant_key(tenant)
        with self._lock:
            known = self._sizes.get(response_id)
            if known is None or known[0] != key:
                evicted = self._tombstones.get(response_id) == key
                raise StoredNotFound(response_id, evicted)
            self._sizes.move_to_end(response_id)
            data = self._memory.get(response_id)
            if data is not None:
                self._memory.move_to_end(response_id)
        if data is not None:
            return _parse(response_id, data)
        read = self._read(response_id)
        if read is None or read[0].tenant != key:
            raise StoredNotFound(response_id)
        record, data = read
        with self._lock:
            if self._sizes.get(response_id) == known:  # not deleted or evicted meanwhile
                self._remember(response_id, data)
        return record

    def held(self, tenant: str, response_id: str) -> Record | None:
        """The tenant's record of that id when it is in memory (no disk read), else None."""
        with self._lock:
            known, data = self._sizes.get(response_id), self._memory.get(response_id)
            if known is None or data is None or known[0] != tenant_key(tenant):
                return None
            self._sizes.move_to_end(response_id)
            self._memory.move_to_end(response_id)
        return _parse(response_id, data)

    def _read(self, response_id: str, head_only: bool = False) -> tuple[Record, bytes] | None:
        """The record's file, parsed, and its bytes (its first line alone: `head_only`);
        None when unreadable."""
        if self.directory is None:
            return None
        try:
            fd = os.open(self._path(f"{response_id}.json"), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.readline() if head_only else f.read()
            return _parse(response_id, data, head_only), data
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("response store: %s unreadable: %s", response_id, error)
            return None

    # ------------------------------------------------------------ writing ----

    def put(self, record: Record) -> None:
        """Keep `record` (its tenant already a digest: `tenant_key`); evict past the bounds."""
        assert ID.fullmatch(record.id), record.id
        data = _serialize(record)
        with self._lock:
            self._sizes[record.id] = (sys.intern(record.tenant), len(data))
            self.bytes += len(data)
            self._remember(record.id, data)
            gone = self._evict()
        if self.directory is not None:
            self._writer.submit(self._write, record.id, data, gone)

    def delete(self, tenant: str, response_id: str) -> None:
        """Forget the tenant's record of that id; StoredNotFound if there is none."""
        key = tenant_key(tenant)
        with self._lock:
            known = self._sizes.get(response_id)
            if known is None or known[0] != key:
                raise StoredNotFound(response_id)
            self._forget(response_id)
        if self.directory is not None:
            self._writer.submit(self._unlink, f"{response_id}.json")

    def close(self) -> None:
        """Finish the writes asked for."""
        self._writer.shutdown(wait=True)

    def _remember(self, response_id: str, data: bytes) -> None:
        """Hold the record's file bytes `data`; past the memory bounds the least recently
        used go (their files stay). Without a directory memory is all there is: the store's
        bounds hold."""
        old = self._memory.pop(response_id, None)
        self._memory_bytes += len(data) - (len(old) if old is not None else 0)
        self._memory[response_id] = data
        if self.directory is None:
            return
        while len(self._memory) > 1 and (
            len(self._memory) > MEMORY_RECORDS or self._memory_bytes > MEMORY_BYTES
        ):
            _, gone = self._memory.popitem(last=False)
            self._memory_bytes -= len(gone)

    def _forget(self, response_id: str) -> None:
        _, nbytes = self._sizes.pop(response_id)
        self.bytes -= nbytes
        held = self._memory.pop(response_id, None)
        if held is not None:
            self._memory_bytes -= len(held)

    def _evict(self) -> list[tuple[str, str]]:
        """Drop the least recently used records past the bounds: their (id, tenant)."""
        gone = []
        while len(self._sizes) > 1 and (
            len(self._sizes) > self.max_count or self.bytes > self.max_bytes
        ):
            response_id, (tenant, _) = next(iter(self._sizes.items()))
            self._forget(response_id)
            self._tombstones[response_id] = tenant
            gone.append((response_id, tenant))
        while len(self._tombstones) > self.max_count:
            old, _ = self._tombstones.popitem(last=False)
            if self.directory is not None:
                self._writer.submit(self._unlink, f"{old}.evicted")
        return gone

    def _write(self, response_id: str, data: bytes, gone: list[tuple[str, str]]) -> None:
        """On the writer thread: the record's file, then the evicted ones' tombstones."""
        try:
            _atomic_write(self._path(f"{response_id}.json"), data)
        except OSError as error:
            log.warning("response store: %s not written: %s", response_id, error)
        for old, tenant in gone:
            self._bury(old, tenant)

    def _bury(self, response_id: str, tenant: str) -> None:
        """An evicted record's file replaced by its tombstone."""
        try:
            _atomic_write(self._path(f"{response_id}.evicted"), tenant.encode())
        except OSError as error:
            log.warning("response store: tombstone of %s not written: %s", response_id, error)
        self._unlink(f"{response_id}.json")

    def _path(self, name: str) -> str:
        """The file `name` of the directory, joined as strings: a `Path` per record's file
        (each request that stores a response writes one) interns its new name, churning
        the interpreter's interned-string table until it resizes (a one-off step of a few
        MiB in a soak)."""
        return os.path.join(self.directory, name)

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            pass
        except OSError as error:
            log.warning("response store: %s not removed: %s", name, error)

    # ---------------------------------------------------------- starting ----

    def _open(self) -> None:
        """The directory's records and tombstones, oldest first; temporary files removed."""
        from engine.storage.directory import private_directory

        private_directory(self.directory)
        found, tombstones = [], []
        for entry in os.scandir(self.directory):
            name = entry.name
            if name.startswith(".tmp-"):
                self._unlink(name)
                continue
            stem, _, suffix = name.partition(".")
            if not ID.fullmatch(stem) or not entry.is_file(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            if st.st_uid != os.getuid():
                log.warning("response store: %s belongs to uid %d; skipped", name, st.st_uid)
                continue
            if st.st_mode & 0o077:
                os.chmod(entry.path, 0o600)
            if suffix == "json":
                found.append((st.st_mtime, stem, st.st_size))
            elif suffix == "evicted":
                tombstones.append((st.st_mtime, stem))
        for _, stem in sorted(tombstones):
            tenant = Path(self.directory / f"{stem}.evicted").read_text()
            self._tombstones[stem] = sys.intern(tenant)
        for _, stem, size in sorted(found):
            read = self._read(stem, head_only=True)
            if read is not None:
                self._sizes[stem] = (sys.intern(read[0].tenant), size)
                self.bytes += size
        for old, tenant in self._evict():  # tighter bounds than the last run's
            self._writer.submit(self._bury, old, tenant)


def _serialize(record: Record) -> bytes:
    """A record's file: a first line naming its id and tenant, then its body (JSON, which
    escapes every newline within a value)."""
    head = {"id": record.id, "tenant": record.tenant, "created": time.time()}
    body = {
        "response": record.response,
        "conversation": list(record.conversation),
        "calls": list(record.calls),
    }
    return (_json(head) + "\n" + _json(body)).encode()


def _parse(response_id: str, data: bytes, head_only: bool = False) -> Record:
    """A record from its file's bytes (a file's or the memory tier's; its first line alone:
    `head_only`, a record with no body); ValueError, KeyError, TypeError or AttributeError
    when they are not one record of that id."""
    first, _, rest = data.partition(b"\n")
    head = json.loads(first)
    if head.get("id") != response_id:
        raise ValueError(f"it names {head.get('id')!r}")
    if head_only:
        return Record(response_id, head["tenant"], {}, ())
    body = json.loads(rest)
    return Record(
        response_id,
        head["tenant"],
        body["response"],
        tuple(body["conversation"]),
        tuple(body.get("calls", ())),
    )


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _atomic_write(path: str, data: bytes) -> None:
    """Write `data` at `path` (0600) under a temporary name, fsync it, rename it."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".tmp-{name}-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
