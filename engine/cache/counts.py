"""The manager's counters and what it reports from them: CacheStats, the anchors' use.

`Counts` is what plans and restores add up (hits by kind, cached and prompt tokens,
evictions, lost restores, misses by kind, answers to wait for a request in flight); a
plan taken back (`replan`) is counted out. `cache_stats` and `anchor_uses` read the
index, the disk index and the counts; they change nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from engine.cache.disk_index import DiskIndex
from engine.cache.index import Index
from engine.cache.kinds import Role
from engine.cache.messages import AnchorUse, CacheStats, RestorePlan


@dataclass
class Counts:
    hits: Counter = field(default_factory=Counter)  # plans by restore kind
    evictions: int = 0  # RAM evictions
    cached_tokens: int = 0  # restored, over every plan
    prompt_tokens: int = 0  # prompted, over every plan
    restores_lost: int = 0
    miss_kinds: Counter = field(default_factory=Counter)
    flight_waits: int = 0  # answers that told a request to wait for one in flight (after)

    def planned(self, plan: RestorePlan, prompt_len: int, sign: int = 1) -> None:
        """Count a plan in (sign -1: out, the request is counted again by its new plan)."""
        self.hits[plan.kind] += sign
        self.cached_tokens += sign * plan.length
        self.prompt_tokens += sign * prompt_len
        if sign < 0 and plan.miss is not None:
            self.miss_kinds[plan.miss.kind] -= 1


def cache_stats(
    mode: str,
    index: Index,
    disk_index: DiskIndex | None,
    counts: Counts,
    disk_evictions: int,
    writes_lost: int,
) -> CacheStats:
    """Counters for the CacheStats RPC."""
    entries = index.entries()
    anchors = [e for e in entries if e.role == Role.ANCHOR]
    checkpoints = Counter(c.kind for e in entries for c in e.checkpoints.values())
    return CacheStats(
        mode=mode,
        entries=len(entries) - len(anchors),
        anchors=len(anchors),
        checkpoints=dict(sorted(checkpoints.items())),
        ram_bytes=sum(e.nbytes for e in entries),
        anchor_bytes=sum(a.nbytes for a in anchors),
        hits=dict(sorted(counts.hits.items())),
        evictions=counts.evictions,
        disk_bytes=disk_index.nbytes if disk_index else 0,
        disk_entries=disk_index.entries if disk_index else 0,
        disk_evictions=disk_evictions,
        damaged_files=disk_index.damaged if disk_index else 0,
        cached_tokens=counts.cached_tokens,
        prompt_tokens=counts.prompt_tokens,
        restores_lost=counts.restores_lost,
        disk_writes_lost=writes_lost,
        misses=dict(sorted((k, n) for k, n in counts.miss_kinds.items() if n)),
        flight_waits=counts.flight_waits,
    )


def anchor_uses(index: Index) -> list[AnchorUse]:
    """Each anchor in RAM with the number of conversation entries that extend it."""
    entries = index.entries()
    out = []
    for a in (e for e in entries if e.role == Role.ANCHOR):
        n = a.length
        sessions = sum(
            1
            for e in entries
            if e.role == Role.CONVERSATION
            and e.namespace == a.namespace
            and e.length >= n
            and np.array_equal(e.tokens[:n], a.tokens)
        )
        out.append(AnchorUse(a.id, a.namespace, n, a.nbytes, sessions))
    return out
