"""What one model replica holds right now: its RAM tier, its batch, its disk writer.

Read on the model loop thread (`tier_stats(generator)`), returned as one
frozen value; the disk figures come from the storage layer's DiskStore.stats().
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TierStats:
    entries: int  # entries held in the RAM tier
    ram_bytes: int
    active: int  # sequences in the batch (prefilling or decoding)
    pending: int  # requests submitted, not admitted yet
    pool_clears: int  # MLX buffer-pool clears per prefill (opt-in)
    disk: dict | None = None  # the disk store's writer and load figures; None: no disk tier


def tier_stats(g) -> TierStats:
    """The figures of generator `g` (call on its loop thread)."""
    disk = g.tier.disk_tier
    return TierStats(
        entries=len(g.tier.entries),
        ram_bytes=g.tier.nbytes,
        active=len(g.active),
        pending=len(g.pending),
        pool_clears=g.bg.pool.count,
        disk=disk.stats() if disk is not None else None,
    )
