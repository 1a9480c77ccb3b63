"""The RAM tier: stored entries' tensors, keyed by entry id. It obeys, never decides.

An entry holds the append-only layers of one finished sequence (as extracted
from the batch, never cloned) and state snapshots keyed by length: the state at
the entry's own length and at each of its checkpoints. A restore at length n
needs a state snapshot at exactly n (or, for a model without state layers,
none) and reads rows [:n] of the append-only layers.

An entry may read its first rows from another entry the tier holds (`Prefix`:
a sub-agent's conversation reads its anchor's rows; engine.cache.shared_rows): its
`layers` then hold only the rows after them, a restore reads each segment's views,
and when that other entry leaves (`Orders.rejoin`, or found gone after a change)
the entry joins the rows into buffers of its own, so the tier holds what the
manager counts. A file or a handover gets the rows joined (`StoredEntry.whole`).

What to keep, move, drop, write or delete comes from the cache manager as
Orders. A new entry (a finished request's, an anchor captured mid-prefill)
waits aside under a staging key (`stage`) until the Orders answering its
commit come back, and enters the tier with them (`enter`): those Orders carry the frees that make
room for it, so the tier never holds more than the manager's budget allows
(the manager keeps its index plus pinned frees within the budget). The disk
tier is reached through the `DiskTier` protocol (the storage layer's
DiskStore fills it), so this module never imports storage.

Every entry carries the token ids its rows were computed on (`StoredEntry.tokens`,
4 bytes a token beside the KV rows' hundreds) and a digest of their prefix at
its restore points (`digests`, a 64-bit hash of the token tuple, taken where
the entry is made). Before a restore, and before a file's or a handed-over
entry enters the tier, `matches` compares the digest of the request's first
tokens with the entry's: an entry id that came to mean other tokens (a
manager that reused an id, a file or a peer's entry under a wrong id) is
refused, counted (`token_mismatches`) and logged, and the request's restore
point is lost (a cache miss), never a continuation of another prompt. The
request's side hashes its own token tuple (a few ns a token); an entry's
digest at a length it lacks (a model without state layers restores at any
length; a loaded or handed-over entry) is taken from its tokens once.

A file read off the loop (`start_load`) is shared by the requests that plan
it and kept only while one of them waits: the first to restore takes it, a
request that leaves before (`forget_load`: cancelled while pending) lets go
of it, and a failed read is never handed to a later plan.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from engine.cache.messages import EntryRecord, Orders, RestorePlan
from engine.runtime import layer_caches

log = logging.getLogger(__name__)


@dataclass
class StoredEntry:
    layers: list  # append-only layers (layer_caches' stored forms), full length
    length: int  # tokens this entry covers (rows of `layers` it may serve)
    states: dict[int, layer_caches.StateSnapshot] = field(default_factory=dict)
    # The prompt end's log-probabilities (what the sampler reads), by length:
    # a resend of that prompt samples its first token here. RAM only.
    logits: dict[int, object] = field(default_factory=dict)
    # The token ids the rows were computed on (int32, at least `length` of them):
    # what a restore checks the request's tokens against. Not counted in `nbytes`
    # (the index counts the tensors), 4 bytes a token.
    tokens: np.ndarray | None = None
    # length -> `digest(tokens[:length])`, taken where the entry is made (from the
    # request's own token list) or at its first check there.
    digests: dict[int, int] = field(default_factory=dict)
    # The entry whose rows [:prefix.length] this one reads as its own first rows (the
    # anchor or conversation it was restored from); `layers` then hold only rows
    # [prefix.length:length]. None: `layers` hold every row.
    prefix: Prefix | None = None

    @property
    def nbytes(self) -> int:
        kv = layer_caches.kv_bytes_per_token(self.layers) * self.own_rows
        logits = sum(a.nbytes for a in self.logits.values())
        return kv + sum(s.nbytes for s in self.states.values()) + logits

    @property
    def own_rows(self) -> int:
        """The rows `layers` hold (all but the prefix's)."""
        return self.length - (self.prefix.length if self.prefix else 0)

    def segments(self, n: int) -> list[tuple[tuple, int]]:
        """(layers, rows) pairs, in token order, that hold rows [:n]: the prefix entry's
        (its own prefix's first), then this entry's."""
        if self.prefix is None:
            return [(self.layers, n)]
        base = self.prefix.length
        if n <= base:
            return self.prefix.entry.segments(n)
        return [*self.prefix.entry.segments(base), (self.layers, n - base)]

    def whole_layers(self) -> tuple:
        """Every row in buffers of this entry's own (a copy, evaluated, where a prefix
        entry holds the first rows)."""
        return layer_caches.join_rows(self.segments(self.length))

    def whole(self) -> StoredEntry:
        """This entry with every row its own (itself when it has no prefix): what a file
        or a peer gets."""
        if self.prefix is None:
            return self
        return dataclasses.replace(self, layers=self.whole_layers(), prefix=None)


@dataclass(frozen=True, eq=False)
class Prefix:
    """The first `length` rows of an entry, read from `entry` (held under `entry_id`)."""

    entry_id: int
    entry: StoredEntry
    length: int


class DiskTier(Protocol):
    """What the RAM tier asks of the disk tier (engine.storage.disk_store.DiskStore)."""

    def write(self, entry: StoredEntry, record: EntryRecord) -> None: ...

    def delete(self, entry_id: int) -> None: ...

    def take_lost(self) -> list[int]: ...  # writes that never reached the disk

    def take_written(self) -> list[tuple[int, int]]: ...  # (id, bytes) of files written

    def skip(self, record: EntryRecord) -> None: ...  # a write ordered that is not done

    def take_resumed(self) -> bool: ...  # writing resumed after a full disk

    def load(
        self, entry_id: int, namespace: str | None = None, tokens=None
    ) -> StoredEntry | None: ...

    def start_read(self, entry_id: int) -> Future: ...  # off the loop: a Future of a read

    def finish(
        self, read: object, namespace: str | None = None, tokens=None
    ) -> StoredEntry | None: ...  # on the loop thread


@dataclass
class _Load:
    """A file read under way or done, and the requests waiting to restore from it."""

    future: Future
    waiting: set[str]


class RamTier:
    """Entry id -> StoredEntry, plus the orders that change it (and the disk tier's files)."""

    def __init__(self, has_state_layers: bool, disk_tier: DiskTier | None = None):
        self.has_state_layers = has_state_layers
        self.entries: dict[int, StoredEntry] = {}
        self.disk_tier = disk_tier
        self.max_id = 0  # the largest id ever held (a restarted manager allocates above it)
        self._loads: dict[int, _Load] = {}  # entry id -> its read, while a request waits for it
        self.token_checks = 0  # restores and entries coming in whose tokens were checked
        self.token_check_seconds = 0.0  # what those checks cost
        self.token_mismatches = 0  # entries refused: their tokens were not the request's
        # Entries waiting for the Orders of their commit, by staging key (one per commit:
        # "request id#entry id"): (entry id, entry) pairs and the tokens they cover.
        self._staged: dict[str, tuple[list[tuple[int, StoredEntry]], int]] = {}
        self.peak = 0  # the most the tier held after any change (bench load reads it)
        self.rejoined = 0  # entries that took their prefix's rows when its entry left
        self._held = 0  # `nbytes`, kept up to date at each change (a sum over entries is slow)

    def start_load(self, plan: RestorePlan, done=None) -> Future | None:
        """Begin reading the plan's file off the loop (`DiskTier.start_read`), if the plan
        needs it and the entry held cannot serve it; the read's Future (`done` runs when
        it ends), else None.
        The loop thread keeps stepping meanwhile; `prepare` takes the result."""
        if not plan.load_from_disk or self.disk_tier is None:
            return None
        if self.can_restore(plan.entry_id, plan.length):
            return None
        load = self._loads.get(plan.entry_id)
        if load is None:
            load = _Load(self.disk_tier.start_read(plan.entry_id), set())
            self._loads[plan.entry_id] = load
            if done is not None:
                load.future.add_done_callback(lambda f: done())
        load.waiting.add(plan.request_id)
        return load.future

    def forget_load(self, plan: RestorePlan) -> None:
        """The request of `plan` no longer waits for its file (cancelled while pending): a
        read nobody else waits for is let go (its buffers with it)."""
        load = self._loads.get(plan.entry_id) if plan.load_from_disk else None
        if load is not None:
            load.waiting.discard(plan.request_id)
            if not load.waiting:  # the read ends unheeded; its buffers go with it
                del self._loads[plan.entry_id]

    @property
    def loads(self) -> int:
        """File reads held for waiting requests (under way or done)."""
        return len(self._loads)

    def put(self, entry_id: int, entry: StoredEntry) -> None:
        self._put(entry_id, entry)
        self.note_peak()

    def _put(self, entry_id: int, entry: StoredEntry) -> None:
        assert entry_id not in self.entries, f"entry {entry_id} stored twice"
        assert entry.tokens is not None and len(entry.tokens) >= entry.length, entry_id
        self.entries[entry_id] = entry
        self._held += entry.nbytes
        self.max_id = max(self.max_id, entry_id)

    def note_peak(self) -> None:
        """Record what the tier holds now against its peak (after each change)."""
        self.peak = max(self.peak, self._held)

    def stage(self, key: str, entries: list[tuple[int, StoredEntry]], tokens: int) -> None:
        """Hold new entries aside under `key` until the Orders of their commit come back
        (`enter`)."""
        assert key not in self._staged, f"{key} staged twice"
        self._staged[key] = (entries, tokens)

    def enter(self, key: str) -> None:
        """The commit's Orders are here: its staged entries enter the tier. The caller
        applies those Orders in the same loop-thread call (their moves and writes need
        the new entry; their frees make its room), so no step sees the tier between."""
        entries, _ = self._staged.pop(key, ([], 0))
        for entry_id, entry in entries:
            self._put(entry_id, entry)  # the peak is noted once the Orders are applied

    def held(self, entry_id: int | None) -> StoredEntry | None:
        """The entry under `entry_id`, in the tier or staged (None: neither)."""
        if entry_id is None:
            return None
        entry = self.entries.get(entry_id)
        if entry is not None:
            return entry
        return next((e for es, _ in self._staged.values() for i, e in es if i == entry_id), None)

    def staged(self, entry_id: int | None) -> bool:
        """Whether `entry_id` waits aside for its commit's Orders."""
        return any(i == entry_id for es, _ in self._staged.values() for i, _ in es)

    @property
    def staged_tokens(self) -> int:
        """Tokens of the finished sequences whose entries wait aside (the batch counts them)."""
        return sum(n for _, n in self._staged.values())

    @property
    def staged_bytes(self) -> int:
        return sum(e.nbytes for es, _ in self._staged.values() for _, e in es)

    def clear(self) -> None:
        """Drop every entry (a restarted cache manager indexes none of them)."""
        self.entries.clear()
        self._loads.clear()
        self._staged.clear()
        self._held = 0

    def prepare(self, plan: RestorePlan, namespace: str | None = None, tokens=None) -> bool:
        """Make the plan's restore source readable: load its disk file when the plan says so
        and the entry held (if any) cannot serve the restore. False when that file failed.

        A load started on the reader thread (`start_read`, while the request waited in
        admission) leaves only its finish to the loop thread; a plan whose read was
        never started loads here, synchronously. The read is the request's no longer
        (`forget_load`), and one that failed is dropped for every request: a later plan
        reads the file again. A file that fails is logged and left out. The file must
        hold the request's `namespace` and its first `plan.length` `tokens`, when given.
        """
        if not plan.load_from_disk or self.disk_tier is None:
            return True
        load = self._loads.get(plan.entry_id)
        self.forget_load(plan)
        if self.can_restore(plan.entry_id, plan.length):
            return True
        expected = None if tokens is None else np.asarray(tokens[: plan.length], np.int32)
        if load is not None:  # read on the reader thread: only the finish is left
            self._loads.pop(plan.entry_id, None)  # taken: the others restore from the tier
            entry = self.disk_tier.finish(load.future.result(), namespace, expected)
        else:
            entry = self.disk_tier.load(plan.entry_id, namespace, expected)
        if entry is None:
            return False
        if expected is not None and not self.matches(entry, expected):
            return False
        # It replaces a held entry that could not serve.
        self._held -= _size(self.entries.pop(plan.entry_id, None))
        self._put(plan.entry_id, entry)
        self._rejoin()  # entries that read their prefix from the one replaced
        self.note_peak()
        return True

    def matches(self, entry: StoredEntry | int | None, tokens) -> bool:
        """Whether `entry` (or the entry held under that id) was computed on `tokens` (the
        request's first tokens, as many as it restores): their digests are equal. A
        mismatch is counted and logged: the entry is refused, the restore becomes a miss."""
        held = self.entries.get(entry) if isinstance(entry, int) else entry
        if held is None:
            return False
        t0 = time.perf_counter()
        n = len(tokens)
        own = held.digests.get(n)
        if own is None and held.tokens is not None and len(held.tokens) >= n:
            own = held.digests[n] = digest(held.tokens[:n])
        same = own is not None and own == digest(tokens)
        self.token_check_seconds += time.perf_counter() - t0
        self.token_checks += 1
        if not same:
            self.token_mismatches += 1
            log.error(
                "entry %s holds other tokens than the request's first %d: refused "
                "(an id confusion; the restore is a cache miss)",
                entry if isinstance(entry, int) else "coming in",
                n,
            )
        return same

    def logits(self, entry_id: int | None, length: int):
        """The log-probabilities kept at `length` of an entry (its prompt end), or None."""
        entry = self.entries.get(entry_id) if entry_id is not None else None
        return entry.logits.get(length) if entry is not None else None

    def can_restore(self, entry_id: int | None, length: int) -> bool:
        entry = self.entries.get(entry_id) if entry_id is not None else None
        if entry is None or length > entry.length:
            return False
        return length in entry.states or not self.has_state_layers

    def restore(self, entry_id: int, length: int, counter=None) -> list:
        """Fresh single-sequence layer caches at `length` (views, no KV copy; rows a
        prefix entry holds are views of its buffers)."""
        entry = self.entries[entry_id]
        state = entry.states.get(length)
        if state is None:  # no state layers: any snapshot gives the layout
            state = next(iter(entry.states.values()))
        *prefix, (layers, _) = entry.segments(length)
        return layer_caches.restore(layers, state, length, counter, prefix)

    def apply(self, orders: Orders) -> None:
        """Moves (absorption), dropped checkpoints, file deletes, writes, then frees.

        A write captures the entry as it is after the moves and drops, before
        the frees (an entry spilled at its eviction is written as it leaves).
        """
        for move in orders.moves:
            src, dst = self.entries.get(move.src), self.entries.get(move.dst)
            if src is None or dst is None or move.length not in src.states:
                log.warning("move %s: source or destination missing", move)
                continue
            replaced = dst.states.get(move.length)
            dst.states[move.length] = src.states[move.length]
            self._held += _size(dst.states[move.length]) - _size(replaced)
        for entry_id, length in orders.drop_checkpoints:
            entry = self.entries.get(entry_id)
            if entry is not None and length != entry.length:
                self._held -= _size(entry.states.pop(length, None))
                self._held -= _size(entry.logits.pop(length, None))
        for entry_id in orders.rejoin:  # their prefix entry leaves: its rows become theirs
            entry = self.entries.get(entry_id)
            if entry is not None and entry.prefix is not None and entry_id not in orders.free:
                self._take_prefix(entry)
        if self.disk_tier is not None:
            # The evicted files go before the new ones are written: the writer works in
            # order, and the manager's budget holds the files after both.
            for entry_id in orders.delete_files:
                self.disk_tier.delete(entry_id)
            for record in orders.records:
                entry = self.entries.get(record.entry_id)
                if entry is None:
                    log.warning("write of entry %d: not held", record.entry_id)
                    self.disk_tier.skip(record)  # lost: the disk index forgets it
                    continue
                try:
                    self.disk_tier.write(entry.whole(), record)  # a file holds every row
                except ValueError:
                    log.exception("write of entry %d skipped", record.entry_id)
                    self.disk_tier.skip(record)
        for entry_id in orders.free:
            self._held -= _size(self.entries.pop(entry_id, None))
        if orders.free:  # only a free takes a prefix entry away
            self._rejoin()
        self.note_peak()  # moves count a shared state twice, as the index does

    def _rejoin(self) -> None:
        """The safety net under Orders.rejoin: an entry whose prefix entry the tier no
        longer holds (freed, replaced by its file) takes those rows into buffers of its
        own, so the tier never holds rows it does not count."""
        for entry in self.entries.values():
            p = entry.prefix
            if p is not None and self.entries.get(p.entry_id) is not p.entry:
                self._take_prefix(entry)

    def _take_prefix(self, entry: StoredEntry) -> None:
        before = entry.nbytes
        entry.layers, entry.prefix = entry.whole_layers(), None
        self._held += entry.nbytes - before
        self.rejoined += 1

    @property
    def nbytes(self) -> int:
        return self._held


def digest(tokens) -> int:
    """A 64-bit digest of a token sequence (a tuple, list or array of ints): the hash of
    its tuple. CPython hashes ints and tuples alike in every process, seeds aside."""
    if isinstance(tokens, np.ndarray):
        tokens = tokens.tolist()
    return hash(tokens if isinstance(tokens, tuple) else tuple(tokens))


def _size(held) -> int:
    """The bytes of a stored entry, state snapshot or logits array; 0 for None."""
    return held.nbytes if held is not None else 0
