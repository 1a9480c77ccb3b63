"""Thinning: which checkpoints of one lineage go when it holds more than the cap.

The drop order, first to last (at most 4 checkpoints per lineage; see
docs/architecture.md, "The cache contract"):

1. old guard points, shortest first: only the newest guard, the one the
   entry's own (latest) prompt captured, is a live resend point; guards
   carried over by absorption served older prompts;
2. turn boundaries carried over by absorption ("final"), oldest (shortest)
   first: they serve only edits and regenerates of older turns;
3. divergence points and long-message points (inside a long system block),
   shortest first: they serve other sessions that branch from this lineage
   (system prompts that differ, a timestamp), so they outlive this lineage's
   older turn boundaries;
4. the newest guard;
5. the current prompt end ("reply"), the newest turn boundary: the landing
   point of a next turn whose template re-renders the reply.

Anchors are separate entries and never reach here. In one lineage a longer
checkpoint is a newer one, so length stands for age.
"""

from __future__ import annotations

from typing import Iterable

from engine.cache.entry import Checkpoint
from engine.cache.kinds import CheckpointKind

_RANK = {
    CheckpointKind.GUARD: 0,
    CheckpointKind.FINAL: 1,
    CheckpointKind.DIVERGENCE: 2,
    CheckpointKind.MESSAGE: 2,
    CheckpointKind.REPLY: 4,
}
_NEWEST_GUARD_RANK = 3


def drop_priority(checkpoint: Checkpoint, live_guard: int | None) -> tuple[int, int]:
    """Sort key, lower dropped first. `live_guard`: the latest prompt's guard length, if any."""
    if checkpoint.kind == CheckpointKind.GUARD and checkpoint.length == live_guard:
        return _NEWEST_GUARD_RANK, checkpoint.length
    return _RANK[checkpoint.kind], checkpoint.length


def thin(
    checkpoints: Iterable[Checkpoint], limit: int, live_guard: int | None = None
) -> list[Checkpoint]:
    """The checkpoints to drop, in drop order, so that at most `limit` remain."""
    ordered = sorted(checkpoints, key=lambda c: drop_priority(c, live_guard))
    return ordered[: max(0, len(ordered) - limit)]
