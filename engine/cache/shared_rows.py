"""Prefix rows stored once: which stored entry a new entry reads its first rows from.

A conversation restored from an anchor (a sub-agent on the shared system prompt and
tools) or from a sibling conversation that stays (a branch, an edit near the end)
would hold a second copy of the rows it restored. Instead it reads them from that
entry: it holds rows [length:] only, and rows [:length] stay the other entry's. A
conversation's next turn absorbs its source, so it reads from what the source read
from (the anchor), and an entry whose prefill captured an anchor reads the anchor's
rows. The manager offers the entry in the plan (`plan_prefix`), the model actor
takes the longer of it and the anchor it stored (`prefix_source`) when it still
holds it, and the manager counts the rows once when that entry is still indexed at
the commit (engine.cache.index).

It knows plans, entries and lengths; nothing of tensors, budgets or files.
"""

from __future__ import annotations

from engine.cache.index import Index
from engine.cache.kinds import Role
from engine.cache.messages import RestorePlan


def plan_prefix(index: Index, plan: RestorePlan) -> tuple[int, int] | None:
    """(entry id, length) the plan's new entry may read its first rows from, or None.

    The restore source at the restored length, or the entry it reads those rows from
    when they are all its prefix's; for a source the commit absorbs (a conversation
    restored at or past its prompt end), what the source itself reads. A plan waiting
    for an anchor another request captures reads that anchor.
    """
    if plan.entry_id is None or plan.length <= 0:
        return None
    if plan.wait:
        return plan.entry_id, plan.length
    source = index.get(plan.entry_id)
    if source is None:
        return None
    if source.role == Role.CONVERSATION and plan.length >= source.prompt_len:  # absorbed
        if source.prefix_id is None:
            return None
        return source.prefix_id, source.prefix_len
    entry, n = source, plan.length
    while entry.prefix_id is not None and n <= entry.prefix_len:
        entry = index.get(entry.prefix_id)
    return entry.id, n


def prefix_source(
    shares: tuple[int, int] | None, anchor: tuple[int, int] | None, min_rows: int
) -> tuple[int, int] | None:
    """(entry id, length) a new entry reads its first rows from, or None: the longer of
    the plan's offer (`RestorePlan.shares`) and the anchor its prefill stored (`anchor`,
    (entry id, length)), when it covers at least `min_rows` tokens (fewer are not worth
    a second segment)."""
    found = [(p[1], p[0]) for p in (shares, anchor) if p is not None]
    if not found:
        return None
    length, entry_id = max(found)
    return (entry_id, length) if length >= max(1, min_rows) else None
