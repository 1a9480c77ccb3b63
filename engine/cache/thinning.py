"""Thinning: which checkpoints of one lineage go when it holds more than the cap.

The drop order, first to last (at most 4 checkpoints per lineage; see
docs/architecture.md, "The cache contract"):

1. old guard points, shortest first: only the newest guard, the one the
   entry's own (latest) prompt captured, is a live resend point; guards
   carried over by absorption served older prompts;
2. turn boundaries carried over by absorption ("final"), oldest (shortest)
   first: they serve only edits and regenerates of older turns;
3. long-message points ("message"), shortest first: they serve edits and
   truncations inside this lineage's own long messages, the latest ones
   most;
4. points inside the system block ("system"), shortest first: they serve
   other sessions whose system prompt differs somewhere inside it (a
   timestamp, a sub-agent's target), so they outlive this lineage's own
   edit points;
5. divergence points, shortest first: where another session did branch from
   this lineage, a restore point already in use, so they outlive the
   system block's points, which only guess where one will;
6. the newest guard;
7. the current prompt end ("reply"), the newest turn boundary: the landing
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
    CheckpointKind.MESSAGE: 2,
    CheckpointKind.SYSTEM: 3,
    CheckpointKind.DIVERGENCE: 4,
    CheckpointKind.REPLY: 6,
}
_NEWEST_GUARD_RANK = 5


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
