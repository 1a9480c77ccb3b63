"""Anchors: the pinned (system + tools) prefix, one separate entry per distinct text.

An anchor is captured at the request's `anchor_len` wherever it falls (also
after the guard point), stored as its own entry, exempt from the
conversation LRU and from absorption, and evicted only by its own caps
(count and bytes, LRU among anchors) or when anchors alone overflow the RAM
budget.
"""

from __future__ import annotations

from engine.cache.entry import Entry
from engine.cache.ram_budget import lru_priority, victims


def wants_anchor(anchor_len: int, restored: int, prompt_len: int) -> bool:
    """Whether a prefill from `restored` to `prompt_len` tokens can capture `anchor_len`.

    Only a length strictly between the two is computed by this prefill: at or
    before `restored` the state comes from the restore source and is never
    computed, so nothing is captured (a later request that restores less will).
    """
    return restored < anchor_len < prompt_len


def anchor_victims(anchors: list[Entry], max_entries: int, max_bytes: int) -> list[Entry]:
    """Anchors to evict, least recently used first, until both anchor caps hold."""
    return victims(sorted(anchors, key=lru_priority), max_entries=max_entries, max_bytes=max_bytes)
