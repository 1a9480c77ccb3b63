"""The disk tier's index: which entry files exist, what they hold, which go when it is full.

What it knows: for each file of this model fingerprint, the entry it holds
as the RAM index sees one (token ids, prompt end, checkpoint kinds, sizes),
with the file's bytes and an LRU clock; for every other file in the
directory (another fingerprint, damaged), only its bytes and age, because it
is never matched but still counts against the budget. What it does not know:
tensors, file formats, MLX.

Eviction order (`disk_priority`, lowest first): damaged files, then files of
another fingerprint, then conversations and the anchors no longer among the
most recently used ones the anchor caps would keep, by LRU; pinned anchors
(those the caps keep) last. Pinned anchor files are not exempt: a timestamp in
a system prompt makes a new anchor every minute, and each one leaves the
pinned set as newer ones arrive.

The storage layer scans the directory (engine.storage.directory) and hands
the files it found here (`index_files`); the files themselves are written and
deleted by the model actor, on the Orders this index's decisions produce.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, replace

import numpy as np

from engine.cache.entry import Checkpoint, Entry
from engine.cache.index import COLD, Lookup, Restore
from engine.cache.kinds import CheckpointKind, Role
from engine.cache.messages import EntryRecord
from engine.cache.tokens import common_prefix

# A disk restore point shorter than this is not worth a file read; it is also
# the length of the token prefix the index buckets files by.
DISK_MIN_TOKENS = 16
HEADER_BYTES = 128 << 10  # bound on a header's meta (structure JSON), before the file exists
_RANK = {"damaged": 0, "foreign": 1, "entry": 2, "pinned": 3}


@dataclass
class DiskFile:
    """One file as the index sees it. `entry` is None for a file never matched."""

    entry_id: int
    nbytes: int
    last_used: int
    entry: Entry | None = None
    reason: str = ""  # why it is never matched: "foreign" or "damaged"


def disk_priority(f: DiskFile, pinned: Container[int]) -> tuple[int, int]:
    """Sort key, lowest evicted first: damaged, foreign, LRU entries, pinned anchors."""
    rank = f.reason if f.entry is None else ("pinned" if f.entry_id in pinned else "entry")
    return _RANK[rank], f.last_used


def file_bytes(entry: Entry) -> int:
    """Expected size of an entry's file: its arrays, its tokens and a header."""
    return entry.nbytes + 4 * entry.length + HEADER_BYTES


def record(entry: Entry) -> EntryRecord:
    """The file header the model actor writes for `entry`."""
    checkpoints = tuple((n, c.kind) for n, c in sorted(entry.checkpoints.items()))
    return EntryRecord(
        entry.id,
        entry.namespace,
        entry.role,
        entry.tokens,
        entry.prompt_len,
        checkpoints,
        entry.kv_bytes_per_token,
        entry.state_bytes,
    )


class DiskIndex:
    """Files by id, entries bucketed by (namespace, first tokens), an LRU clock and a budget."""

    def __init__(
        self, budget: int, anchor_max_entries: int = 16, anchor_max_bytes: int = 16 << 30
    ) -> None:
        self.budget = budget
        self.anchor_max_entries = anchor_max_entries
        self.anchor_max_bytes = anchor_max_bytes
        self.files: dict[int, DiskFile] = {}
        self._buckets: dict[tuple[str, bytes], dict[int, DiskFile]] = {}
        self._clock = 0
        self.max_id = 0
        self.damaged = 0  # files found damaged: at the scan, and at loads since
        # Superseded files still on disk: their successor's id -> their bytes. The writer
        # deletes them once the successor's file is durable, so until then they hold
        # disk bytes the budget must count though no lookup can find them.
        self.leaving: dict[int, int] = {}

    # -- contents ----------------------------------------------------------

    def add(self, entry: Entry, nbytes: int) -> None:
        """Index the file of `entry` (an own copy) as the most recently used."""
        assert entry.id not in self.files, entry.id
        f = DiskFile(entry.id, nbytes, 0, replace(entry, checkpoints=dict(entry.checkpoints)))
        self.files[entry.id] = f
        if entry.length >= DISK_MIN_TOKENS:
            self._buckets.setdefault(_key(entry.namespace, entry.tokens), {})[entry.id] = f
        self.max_id = max(self.max_id, entry.id)
        self.touch(entry.id)

    def add_other(self, entry_id: int, nbytes: int, reason: str) -> None:
        """Index a file that is never matched (another fingerprint, damaged)."""
        assert entry_id not in self.files and reason in ("foreign", "damaged"), entry_id
        self.files[entry_id] = DiskFile(entry_id, nbytes, 0, None, reason)
        self.max_id = max(self.max_id, entry_id)
        self.touch(entry_id)

    def remove(self, entry_id: int) -> DiskFile:
        """Forget the file of `entry_id`: evicted, lost or damaged (its deletion ordered or
        done), so the files it superseded go with it (Orders drops their wait)."""
        self.leaving.pop(entry_id, None)
        return self._forget(entry_id)

    def supersede(self, entry_id: int, old: int) -> None:
        """`old`'s file leaves the index for `entry_id`'s, ordered written: its bytes (and
        those it was itself waiting to delete) stay counted until that write is done."""
        held = self._forget(old).nbytes + self.leaving.pop(old, 0)
        self.leaving[entry_id] = self.leaving.get(entry_id, 0) + held

    def _forget(self, entry_id: int) -> DiskFile:
        f = self.files.pop(entry_id)
        if f.entry is not None and f.entry.length >= DISK_MIN_TOKENS:
            key = _key(f.entry.namespace, f.entry.tokens)
            del self._buckets[key][entry_id]
            if not self._buckets[key]:
                del self._buckets[key]
        return f

    def resize(self, entry_id: int, nbytes: int) -> None:
        """The file of `entry_id` (if still indexed) holds `nbytes` on disk: it is
        written, so the files it superseded are deleted."""
        self.leaving.pop(entry_id, None)
        f = self.files.get(entry_id)
        if f is not None:
            f.nbytes = nbytes

    def touch(self, entry_id: int) -> None:
        if entry_id in self.files:
            self._clock += 1
            self.files[entry_id].last_used = self._clock

    def entry(self, entry_id: int | None) -> Entry | None:
        f = self.files.get(entry_id) if entry_id is not None else None
        return f.entry if f is not None else None

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self.files

    @property
    def nbytes(self) -> int:
        """The bytes the budget holds: the indexed files and the superseded ones still
        on disk."""
        return sum(f.nbytes for f in self.files.values()) + sum(self.leaving.values())

    @property
    def entries(self) -> int:
        """Files this model can restore from."""
        return sum(f.entry is not None for f in self.files.values())

    # -- lookup --------------------------------------------------------------

    def lookup(
        self,
        namespace: str,
        query: np.ndarray,
        has_state_layers: bool,
        longer_than: int = 0,
        skip: Container[int] = (),
    ) -> Lookup:
        """The longest restore point within `query` longer than `longer_than`, or COLD.

        Reads only the files that share the query's first DISK_MIN_TOKENS tokens
        and are longer than `longer_than`; ids in `skip` (held in RAM) are left
        out. Ties go to the most recently used file.
        """
        if len(query) < max(DISK_MIN_TOKENS, longer_than + 1):
            return Lookup(COLD, 0)
        best: tuple[int, int, Entry, str] | None = None
        sibling = 0
        for f in self._buckets.get(_key(namespace, query), {}).values():
            entry = f.entry
            if entry.id in skip or entry.length <= longer_than:
                continue
            lcp = common_prefix(entry.tokens, query)
            sibling = max(sibling, lcp)
            point = entry.restore_point(lcp, has_state_layers)
            if not point or point[0] <= longer_than:
                continue
            if best is None or (point[0], f.last_used) > best[:2]:
                best = (point[0], f.last_used, entry, point[1])
        if best is None:
            return Lookup(COLD, sibling)
        return Lookup(Restore(best[2].id, best[0], best[3]), sibling)

    # -- budget -----------------------------------------------------------------

    def pinned_anchors(self) -> set[int]:
        """The most recently used anchors that fit the anchor caps."""
        anchors = sorted(
            (f for f in self.files.values() if f.entry is not None and f.entry.role == Role.ANCHOR),
            key=lambda f: -f.last_used,
        )
        out, total = set(), 0
        for f in anchors:
            if len(out) >= self.anchor_max_entries or total + f.nbytes > self.anchor_max_bytes:
                break
            out.add(f.entry_id)
            total += f.nbytes
        return out

    def victims(self, keep: Container[int] = ()) -> list[DiskFile]:
        """Files to delete, in eviction order, until the rest fits the budget; `keep` stays."""
        total = self.nbytes
        if total <= self.budget:
            return []
        pinned = self.pinned_anchors()
        out = []
        for f in sorted(self.files.values(), key=lambda f: disk_priority(f, pinned)):
            if total <= self.budget:
                break
            if f.entry_id not in keep:
                out.append(f)
                total -= f.nbytes
        return out

    def check(self) -> None:
        """Assert the buckets and the clock agree with the files."""
        bucketed = {i for group in self._buckets.values() for i in group}
        expected = {
            i
            for i, f in self.files.items()
            if f.entry is not None and f.entry.length >= DISK_MIN_TOKENS
        }
        assert bucketed == expected, (bucketed, expected)
        for key, group in self._buckets.items():
            assert group
            for entry_id, f in group.items():
                assert self.files[entry_id] is f and _key(f.entry.namespace, f.entry.tokens) == key
        for entry_id, f in self.files.items():
            assert f.entry_id == entry_id and f.nbytes >= 0 and 0 < f.last_used <= self._clock
            assert (f.entry is None) != (f.reason == ""), f
            if f.entry is not None:
                assert f.entry.id == entry_id and f.entry.role in tuple(Role)
                f.entry.check()
        clocks = [f.last_used for f in self.files.values()]
        assert len(set(clocks)) == len(clocks), "disk LRU clock values repeat"


def _key(namespace: str, tokens: np.ndarray) -> tuple[str, bytes]:
    return namespace, np.ascontiguousarray(tokens[:DISK_MIN_TOKENS], dtype=np.int32).tobytes()


@dataclass(frozen=True)
class FoundFile:
    """A file of the cache directory as the storage layer's scan found it.

    `record` is what its header says (None when the header failed a check,
    `problem` then says why); `fingerprint` the model it was written for.
    """

    entry_id: int
    nbytes: int
    mtime: float
    fingerprint: str = ""
    record: EntryRecord | None = None
    problem: str | None = None


def entry_of(record: EntryRecord) -> Entry:
    """The index's Entry for a file's record; ValueError for an unknown checkpoint kind."""
    kinds = [CheckpointKind(kind) for _, kind in record.checkpoints]  # ValueError if unknown
    return Entry(
        record.entry_id,
        record.namespace,
        Role(record.role),
        record.tokens,
        record.prompt_len,
        record.kv_bytes_per_token,
        record.state_bytes,
        {n: Checkpoint(n, kind) for (n, _), kind in zip(record.checkpoints, kinds)},
    )


def index_files(
    found: Iterable[FoundFile],
    fingerprint: str,
    budget: int,
    anchor_max_entries: int = 16,
    anchor_max_bytes: int = 16 << 30,
    max_id: int = 0,
) -> DiskIndex:
    """A DiskIndex of a directory's files: own files matchable, the others counted; LRU by mtime.

    `max_id`: the largest id the directory holds (temporary files included), so
    new ids never reuse one.
    """
    index = DiskIndex(budget, anchor_max_entries, anchor_max_bytes)
    index.max_id = max_id
    for f in sorted(found, key=lambda f: (f.mtime, f.entry_id)):
        problem = f.problem
        if f.record is not None and f.fingerprint == fingerprint:
            try:
                index.add(entry_of(f.record), f.nbytes)
                continue
            except ValueError as e:
                problem = str(e)
        if problem is not None:
            index.damaged += 1
            index.add_other(f.entry_id, f.nbytes, "damaged")
        else:
            index.add_other(f.entry_id, f.nbytes, "foreign")
    return index


def persist(disk: DiskIndex | None, entry: Entry, orders) -> None:
    """Order the file of an entry (unless it alone exceeds the disk budget)."""
    if disk is None or entry.id in disk:
        return
    # A file holds every row, also those the RAM entry reads from another entry.
    entry = replace(entry, prefix_id=None, prefix_len=0)
    nbytes = file_bytes(entry)
    if nbytes <= disk.budget:
        disk.add(entry, nbytes)
        orders.write(record(entry))


def evict_disk(disk: DiskIndex | None, index, orders) -> list[int]:
    """Delete the files that exceed the disk budget (never one a request pins); their ids."""
    if disk is None:
        return []
    pinned = {entry_id for entry_id, _ in index.pins.values()}
    out = [f.entry_id for f in disk.victims(keep=pinned)]
    for entry_id in out:
        disk.remove(entry_id)
        orders.delete_file(entry_id)
    return out
