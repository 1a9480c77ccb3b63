"""Long-message points: state checkpoints inside the long messages a prefill runs through.

A message is a span of prompt tokens with the spacing of its points,
`(start, end, spacing)`: the (system + tools) block, `[0, anchor_len)`, and
each message the front end located (`PlanRequest.message_spans`: a user
message, a tool result, an assistant message). Inside each span a point falls
every `spacing` tokens from the span's own start, strictly before its end, so
a message holds the same points wherever it sits in the conversation and a
short message holds none. An edit or a truncation inside a long message then
restores at the last point before it instead of at the turn boundary before
the message. Of the points this prefill computes (`restored < n < size`), the
longest `most` are taken: thinning keeps the longest long-message points of a
lineage (engine.cache.thinning), so shorter ones would be captured only to be
dropped at commit.

`spacing` says how a message's length gives its spacing: the system block's
is fixed (its points serve other sessions' system prompts, which differ
anywhere in it); a message's is a fraction of its length, never below a
floor (`message_spacing`), so the points thinning keeps, its longest two,
cover its last quarter whatever its length, and an edit or a truncation
there restores at most an eighth of the message short.

It knows token offsets only: no tokens, no roles, no entries.
"""

from __future__ import annotations

from typing import Iterable

Span = tuple[int, int]
SLICES = 8  # a long message's points cut it into at most this many parts


def message_spacing(length: int, floor: int) -> int:
    """The spacing of the points inside a message of `length` tokens; 0 (none) when the
    floor is 0."""
    if floor <= 0:
        return 0
    return max(floor, -(-length // SLICES))


def message_points(
    spans: Iterable[tuple[int, int, int]], most: int, restored: int, size: int
) -> list[int]:
    """The long-message points of a prefill from `restored` to `size` tokens, ascending;
    `spans`: (start, end, spacing), a spacing of 0 placing none."""
    points = set()
    for start, end, spacing in spans:
        if spacing > 0:
            first = start + spacing * max(1, (restored - start) // spacing + 1)
            points.update(range(first, min(end, size), spacing))
    return sorted(points)[-most:] if most > 0 else []


def check_spans(spans, size: int) -> tuple[Span, ...]:
    """`spans` as a tuple of int pairs; ValueError unless each is a non-empty (start, end)
    within [0, size], in ascending order and not overlapping."""
    out, last = [], 0
    for i, span in enumerate(spans):
        try:
            start, end = (int(n) for n in span)
        except (TypeError, ValueError):
            raise ValueError(f"message_spans[{i}] is {span!r}, not a (start, end) pair") from None
        if not last <= start < end <= size:
            raise ValueError(
                f"message_spans[{i}] = ({start}, {end}) must lie within [0, {size}] (the "
                f"prompt's tokens), after the span before it and be non-empty"
            )
        out.append((start, end))
        last = end
    return tuple(out)
