"""The RAM tier's budget: eviction order and the victims that make a set of entries fit.

(The disk tier's budget and order are in disk_index.)

Pure arithmetic over Entry sizes; the caller removes the victims from the
index (which defers the frees of pinned ones).
"""

from __future__ import annotations

from typing import Sequence

from engine.cache.entry import Entry
from engine.cache.kinds import Role


def lru_priority(entry: Entry) -> tuple[int]:
    """Sort key: least recently used first."""
    return (entry.last_used,)


def ram_priority(entry: Entry) -> tuple[bool, int]:
    """Sort key for the one RAM budget: conversations (LRU) before anchors (LRU).

    Anchors are exempt from the conversation LRU; they go only when the
    conversations alone cannot bring the total under the budget.
    """
    return entry.role == Role.ANCHOR, entry.last_used


def victims(
    ordered: Sequence[Entry], max_entries: int | None = None, max_bytes: int | None = None
) -> list[Entry]:
    """The first entries of `ordered` to evict so that the rest fit both caps (None: no cap)."""
    count = len(ordered)
    total = sum(e.nbytes for e in ordered)
    out: list[Entry] = []
    for entry in ordered:
        fits_count = max_entries is None or count <= max_entries
        if fits_count and (max_bytes is None or total <= max_bytes):
            break
        out.append(entry)
        count -= 1
        total -= entry.nbytes
    return out
