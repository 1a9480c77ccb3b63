"""The RAM tier: stored entries' tensors, keyed by entry id. It obeys, never decides.

An entry holds the append-only layers of one finished sequence (as extracted
from the batch, never cloned) and state snapshots keyed by length: the state at
the entry's own length and at each of its checkpoints. A restore at length n
needs a state snapshot at exactly n (or, for a model without state layers,
none) and reads rows [:n] of the append-only layers.

What to keep, move or drop comes from the cache manager as Orders.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from engine import snapshot
from engine.messages import Orders

log = logging.getLogger(__name__)


@dataclass
class StoredEntry:
    layers: list  # append-only layers (snapshot module's stored form), full length
    length: int  # tokens this entry covers (rows of `layers` it may serve)
    states: dict[int, "snapshot.StateSnapshot"] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        kv = snapshot.kv_bytes_per_token(self.layers) * self.length
        return kv + sum(s.nbytes for s in self.states.values())


class RamTier:
    """Entry id -> StoredEntry, plus the orders that change it."""

    def __init__(self, has_state_layers: bool):
        self.has_state_layers = has_state_layers
        self.entries: dict[int, StoredEntry] = {}

    def put(self, entry_id: int, entry: StoredEntry) -> None:
        assert entry_id not in self.entries, f"entry {entry_id} stored twice"
        self.entries[entry_id] = entry

    def prepare(self, plan) -> None:
        """Make the plan's restore source readable (the disk tier hooks in here)."""

    def can_restore(self, entry_id: int | None, length: int) -> bool:
        entry = self.entries.get(entry_id) if entry_id is not None else None
        if entry is None or length > entry.length:
            return False
        return length in entry.states or not self.has_state_layers

    def restore(self, entry_id: int, length: int, counter=None) -> list:
        """Fresh single-sequence layer caches at `length` (views, no KV copy)."""
        entry = self.entries[entry_id]
        state = entry.states.get(length)
        if state is None:  # no state layers: any snapshot gives the layout
            state = next(iter(entry.states.values()))
        return snapshot.restore(entry.layers, state, length, counter)

    def apply(self, orders: Orders) -> None:
        """Moves first (absorption), then dropped checkpoints, then frees."""
        for move in orders.moves:
            src, dst = self.entries.get(move.src), self.entries.get(move.dst)
            if src is None or dst is None or move.length not in src.states:
                log.warning("move %s: source or destination missing", move)
                continue
            dst.states[move.length] = src.states[move.length]
        for entry_id, length in orders.drop_checkpoints:
            entry = self.entries.get(entry_id)
            if entry is not None and length != entry.length:
                entry.states.pop(length, None)
        for entry_id in orders.free:
            self.entries.pop(entry_id, None)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())
