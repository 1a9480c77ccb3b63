"""The index of stored entries: lookup, the LRU clock, and the pins of in-flight requests.

The index knows which entries the model actor holds (ids, token arrays,
lengths, kinds, bytes) and which restore points planned requests still have
to read. It decides nothing about placement or eviction; the policies do.

In-flight pinning: a plan pins its restore point (entry id, length) until the
request's commit or release, because the model actor may not have restored it
yet. An entry that leaves the index while pinned (absorbed, evicted) is no
longer found by lookups, but its free is deferred: it is ordered in the
Orders of the commit or release that removes the last pin. A pinned
checkpoint is never dropped: thinning only touches the entry being
committed, which nobody can have planned from yet. Absorption may move a
pinned point: a move copies the state to the new entry (the model actor's
arrays are shared), and the source keeps it until its deferred free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cache.entry import Entry
from engine.cache.kinds import RestoreKind, Role
from engine.cache.orders import OrderBook
from engine.cache.tokens import common_prefix


@dataclass(frozen=True)
class Restore:
    """A restore point: `length` tokens of entry `entry_id`; (None, 0, NONE) when cold."""

    entry_id: int | None
    length: int
    kind: RestoreKind


COLD = Restore(None, 0, RestoreKind.NONE)


@dataclass(frozen=True)
class Lookup:
    """The best restore point for a query, and the longest prefix any entry shares with it."""

    restore: Restore
    sibling_lcp: int


class Index:
    """Entries by id and namespace, with an LRU clock and in-flight pins."""

    def __init__(self) -> None:
        self._entries: dict[int, Entry] = {}
        # entry id -> ids of the indexed entries that read their first rows from it
        self._dependents: dict[int, set[int]] = {}
        self._by_namespace: dict[str, dict[int, Entry]] = {}
        self._clock = 0
        self._pins: dict[str, tuple[int, int]] = {}  # request id -> (entry id, length)
        self._deferred_free: dict[int, Entry] = {}  # entry id -> the entry, in order

    # -- storage -----------------------------------------------------------

    def add(self, entry: Entry) -> None:
        """Index a new entry as the most recently used."""
        assert entry.id not in self._entries and entry.id not in self._deferred_free, entry.id
        base = self._entries.get(entry.prefix_id) if entry.prefix_id is not None else None
        n = entry.prefix_len
        if (
            base is None  # gone meanwhile (evicted, absorbed): it holds every row
            or not 0 < n <= base.length
            or n >= entry.length
            or not np.array_equal(base.tokens[:n], entry.tokens[:n])
        ):
            entry.prefix_id, entry.prefix_len = None, 0
        else:
            self._dependents.setdefault(base.id, set()).add(entry.id)
        self._entries[entry.id] = entry
        self._by_namespace.setdefault(entry.namespace, {})[entry.id] = entry
        self.touch(entry)

    def touch(self, entry: Entry) -> None:
        """Make `entry` the most recently used, and after it the entries it reads its
        first rows from (so the LRU order reaches an entry after those that read it)."""
        while entry is not None:
            self._clock += 1
            entry.last_used = self._clock
            entry = self._entries.get(entry.prefix_id) if entry.prefix_id is not None else None

    def has_dependents(self, entry_id: int) -> bool:
        """Whether an indexed entry reads its first rows from `entry_id`."""
        return bool(self._dependents.get(entry_id))

    def shared_bytes(self) -> int:
        """RAM bytes the entries that read rows from another do not hold twice."""
        return sum(e.prefix_len * e.kv_bytes_per_token for e in self._entries.values())

    def get(self, entry_id: int | None) -> Entry | None:
        return self._entries.get(entry_id) if entry_id is not None else None

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self._entries

    def entries(self, role: Role | None = None) -> list[Entry]:
        """Indexed entries (of one role), in insertion order."""
        return [e for e in self._entries.values() if role is None or e.role == role]

    def add_unique(self, entry: Entry, orders: OrderBook) -> None:
        """Index `entry` unless its namespace and role already hold its tokens.

        Then the stored one is touched and `entry`'s id freed: a parallel request
        (or a resend, in exact mode) stored the same prefix first.
        """
        existing = self.find_equal(entry.namespace, entry.role, entry.tokens)
        if existing is None:
            self.add(entry)
        else:
            self.touch(existing)
            orders.free(entry.id)

    def find_equal(self, namespace: str, role: Role, tokens: np.ndarray) -> Entry | None:
        """The entry of this namespace and role whose tokens equal `tokens`, if any."""
        for entry in self._by_namespace.get(namespace, {}).values():
            same = entry.length == len(tokens) and np.array_equal(entry.tokens, tokens)
            if entry.role == role and same:
                return entry
        return None

    def prompt_end(self, namespace: str, prompt: np.ndarray) -> Entry | None:
        """The most recently used entry whose prompt end, with its log-probabilities, is
        exactly `prompt` (a verbatim resend restores there whole)."""
        n = len(prompt)
        found = [
            e
            for e in self._by_namespace.get(namespace, {}).values()
            if e.logits_at == n and np.array_equal(e.tokens[:n], prompt)
        ]
        return max(found, key=lambda e: e.last_used, default=None)

    def lookup(self, namespace: str, query: np.ndarray, has_state_layers: bool) -> Lookup:
        """The longest restore point within `query` in this namespace.

        Ties go to the most recently used entry. Touches nothing; the caller
        touches the entry it uses.
        """
        best: tuple[int, int, Entry, str] | None = None  # (length, last_used, entry, kind)
        sibling = 0
        for entry in self._by_namespace.get(namespace, {}).values():
            lcp = common_prefix(entry.tokens, query)
            sibling = max(sibling, lcp)
            point = entry.restore_point(lcp, has_state_layers)
            if point and (best is None or (point[0], entry.last_used) > best[:2]):
                best = (point[0], entry.last_used, entry, point[1])
        if best is None:
            return Lookup(COLD, sibling)
        return Lookup(Restore(best[2].id, best[0], best[3]), sibling)

    # -- pins and frees ------------------------------------------------------

    def pin(self, request_id: str, entry_id: int, length: int) -> None:
        """Keep the restore point (entry_id, length) readable until `unpin(request_id)`."""
        assert entry_id in self._entries, entry_id
        self._pins[request_id] = (entry_id, length)

    def unpin(self, request_id: str) -> None:
        self._pins.pop(request_id, None)

    def pinned(self, entry_id: int, length: int | None = None) -> bool:
        """Whether an in-flight request reads entry `entry_id` (at `length`, when given)."""
        return any(e == entry_id and length in (None, n) for e, n in self._pins.values())

    def free(self, entry_id: int, orders: OrderBook) -> Entry:
        """Remove an entry from the index; order its free now, or once no request pins it."""
        entry = self._entries.pop(entry_id)
        del self._by_namespace[entry.namespace][entry_id]
        if entry.prefix_id is not None:
            self._dependents.get(entry.prefix_id, set()).discard(entry_id)
            if not self._dependents.get(entry.prefix_id, True):
                del self._dependents[entry.prefix_id]
        for dependent in sorted(self._dependents.pop(entry_id, ())):
            # It holds (and counts) every row from now on: the actor's tier copies them
            # into its own buffers before it applies this free.
            held = self._entries[dependent]
            held.prefix_id, held.prefix_len = None, 0
            orders.rejoin(dependent)
        if not self._by_namespace[entry.namespace]:
            del self._by_namespace[entry.namespace]
        if self.pinned(entry_id):
            self._deferred_free[entry_id] = entry
        else:
            orders.free(entry_id)
        return entry

    def flush(self, orders: OrderBook) -> list[Entry]:
        """Order the deferred frees whose pins are gone; those entries."""
        out = []
        for entry_id in list(self._deferred_free):
            if not self.pinned(entry_id):
                out.append(self._deferred_free.pop(entry_id))
                orders.free(entry_id)
        return out

    @property
    def pins(self) -> dict[str, tuple[int, int]]:
        """Request id -> the (entry id, length) it pins."""
        return dict(self._pins)

    @property
    def deferred(self) -> tuple[int, ...]:
        """Ids out of the index whose free waits for a pin to go."""
        return tuple(self._deferred_free)

    def deferred_entry(self, entry_id: int) -> Entry | None:
        """The entry out of the index whose free waits for a pin (None: not one)."""
        return self._deferred_free.get(entry_id)

    @property
    def deferred_bytes(self) -> int:
        """What the deferred frees a pin still holds keep in RAM (the RAM budget counts it;
        one whose pin went is freed at the next flush)."""
        return sum(e.nbytes for i, e in self._deferred_free.items() if self.pinned(i))

    # -- invariants ----------------------------------------------------------

    def check(self) -> None:
        """Assert the index's invariants (entries, namespaces, clock, pins)."""
        by_namespace = {i for group in self._by_namespace.values() for i in group}
        assert by_namespace == set(self._entries), "namespace map out of step"
        for namespace, group in self._by_namespace.items():
            assert group, namespace
            for entry_id, entry in group.items():
                assert self._entries[entry_id] is entry and entry.namespace == namespace
        for entry_id, entry in self._entries.items():
            assert entry.id == entry_id
            assert 0 < entry.last_used <= self._clock
            entry.check()
        for entry in self._entries.values():
            if entry.prefix_id is not None:
                base = self._entries.get(entry.prefix_id)
                assert base is not None, (entry.id, entry.prefix_id)
                assert entry.prefix_len <= base.length, (entry.id, entry.prefix_len)
                assert np.array_equal(
                    base.tokens[: entry.prefix_len], entry.tokens[: entry.prefix_len]
                )
                assert entry.id in self._dependents.get(base.id, ()), entry.id
                assert base.last_used > entry.last_used, "a prefix entry is older than its reader"
        for base_id, dependents in self._dependents.items():
            assert dependents and base_id in self._entries, base_id
            assert all(self._entries[d].prefix_id == base_id for d in dependents)
        clocks = [e.last_used for e in self._entries.values()]
        assert len(set(clocks)) == len(clocks), "LRU clock values repeat"
        assert not set(self._deferred_free) & set(self._entries)
        for entry_id in self._deferred_free:
            assert self.pinned(entry_id), f"deferred free of unpinned entry {entry_id}"
        for entry_id, length in self._pins.values():
            assert entry_id in self._entries or entry_id in self._deferred_free, entry_id
            assert length > 0
