"""Long-message points: state checkpoints inside the long messages a prefill runs through.

A message is a span of prompt tokens, `(start, end)`: the (system + tools)
block, `[0, anchor_len)`, and each message the front end located
(`PlanRequest.message_spans`: a user message, a tool result, an assistant
message). Inside each span a point falls every `interval` tokens from the
span's own start, strictly before its end, so a message holds the same points
wherever it sits in the conversation and a short message holds none. An edit
or a truncation inside a long message then restores at the last point before
it, at most `interval` tokens short, instead of at the turn boundary before
the message. Of the points this prefill computes (`restored < n < size`), the
longest `most` are taken: thinning keeps the longest long-message points of a
lineage (engine.cache.thinning), so shorter ones would be captured only to be
dropped at commit.

It knows token offsets only: no tokens, no roles, no entries.
"""

from __future__ import annotations

from typing import Iterable

Span = tuple[int, int]


def message_points(
    spans: Iterable[Span], interval: int, most: int, restored: int, size: int
) -> list[int]:
    """The long-message points of a prefill from `restored` to `size` tokens, ascending."""
    if interval <= 0 or most <= 0:
        return []
    points = set()
    for start, end in spans:
        first = start + interval * max(1, (restored - start) // interval + 1)
        points.update(range(first, min(end, size), interval))
    return sorted(points)[-most:]


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
