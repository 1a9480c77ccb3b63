"""Exact mode, the baseline every benchmark compares: whole-prompt snapshots, plain LRU.

Each request stores two full snapshots, at the prompt minus `guard_offset`
(a separate entry, so a verbatim resend still has an uncached token) and at
the full prompt; a prompt restores from the longest snapshot whose tokens are
a prefix of it. No checkpoints, no absorption, no anchors; eviction is LRU by
count (`exact_max_entries`) and by the RAM budget. With a disk tier, every
snapshot gets its file, as the old tier wrote them (in a directory of exact
mode's own); this baseline does not read them back.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from engine.cache.disk_index import DiskIndex, persist
from engine.cache.entry import Entry
from engine.cache.index import Index
from engine.cache.kinds import CaptureKind, Role
from engine.cache.messages import CapturePoint, Commit, RestorePlan
from engine.cache.orders import OrderBook
from engine.cache.ram_budget import lru_priority, victims
from engine.config import CacheConfig


class ExactPolicy:
    """Plans, commits and evictions of exact mode over a shared Index."""

    def __init__(
        self,
        config: CacheConfig,
        index: Index,
        new_id: Callable[[], int],
        has_state_layers: bool,
        disk: DiskIndex | None = None,
    ) -> None:
        self.config = config
        self.index = index
        self._new_id = new_id  # has_state_layers is ignored: snapshots match whole
        self.disk_index = disk

    def plan(
        self,
        request_id: str,
        namespace: str,
        prompt: np.ndarray,
        anchor_len: int,
        message_spans: tuple = (),
        marks: tuple = (),
    ) -> RestorePlan:
        """Restore the longest snapshot within prompt[:-1]; capture prompt minus offset, and prompt.

        `anchor_len`, `message_spans` and `marks` are ignored: exact mode has no anchors
        and no checkpoints.
        """
        restore = self.index.lookup(namespace, prompt[:-1], has_state_layers=True).restore
        new_entry_id = self._new_id()
        guard = len(prompt) - self.config.guard_offset
        captures = ()
        if guard > restore.length:
            captures = (CapturePoint(guard, CaptureKind.SNAPSHOT, self._new_id()),)
        return RestorePlan(
            request_id,
            restore.entry_id,
            restore.length,
            restore.kind,
            captures,
            new_entry_id=new_entry_id,
            store_reply=False,
        )

    def commit(self, c: Commit, tokens: np.ndarray, orders: OrderBook) -> None:
        """Store the prompt-minus-offset snapshot, then the full prompt's (the most recently used).

        A snapshot whose tokens are already stored is freed (a resend).
        """
        snapshots = [
            Entry.committed(c, point.entry_id, Role.SNAPSHOT, tokens[: point.length].copy())
            for point in c.captures
        ] + [Entry.committed(c, c.entry_id, Role.SNAPSHOT, tokens)]
        for snapshot in snapshots:
            self.index.add_unique(snapshot, orders)
            if self.index.get(snapshot.id) is not None:
                persist(self.disk_index, snapshot, orders)

    def evict(self, orders: OrderBook) -> list[Entry]:
        """Evict least recently used snapshots beyond the count cap or the RAM budget."""
        cfg = self.config
        ordered = sorted(self.index.entries(), key=lru_priority)
        room = max(0, cfg.ram_budget - self.index.deferred_bytes)  # pinned frees hold RAM
        out = victims(ordered, max_entries=cfg.exact_max_entries, max_bytes=room)
        for entry in out:
            self.index.free(entry.id, orders)
        return out

    def check(self) -> None:
        """Assert exact mode's invariants: snapshots only, within the count cap and RAM budget."""
        entries = self.index.entries()
        assert all(e.role == Role.SNAPSHOT for e in entries)
        assert len(entries) <= self.config.exact_max_entries
        assert sum(e.nbytes for e in entries) <= self.config.ram_budget
