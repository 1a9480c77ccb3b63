"""Long-message points: state checkpoints inside the long messages a prefill runs through.

A message is a span of prompt tokens with the spacing of its points,
`(start, end, spacing)`: the (system + tools) block, `[0, anchor_len)`, and
each message after it (a user message, a tool result, an assistant message),
from where the chat template starts it to where the next one starts
(`PromptLayout.spans`, from the starts the front end found by rendering the
template per message prefix). Inside each span a point falls
every `spacing` tokens from the span's own start, strictly before its end, so
a message holds the same points wherever it sits in the conversation and a
short message holds none.

The spacing is a fraction of the span's length, never below a floor
(`--message-interval`), because thinning leaves a lineage only two or so of
these points beside its guard and prompt end, its longest
(engine.cache.thinning), so the fraction decides how far back they reach:

- a message's points are an eighth of it apart (`MESSAGE_SLICES`): its last
  two cover its last quarter, where a user's fix or an agent's truncation
  falls, and an edit there restores at most an eighth of the message short
  instead of at the turn boundary before the message;
- the system block's are a third apart (`SYSTEM_SLICES`): its two points
  spread over it, since the other sessions they serve differ anywhere in it
  (a timestamp, a sub-agent's target).

Of the points this prefill computes (`restored < n < size`), a plan takes the
longest `most` of a kind, those thinning would keep.

It knows token offsets only: no tokens, no roles, no entries.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

Span = tuple[int, int]
MESSAGE_SLICES = 8  # a message's points cut it into at most this many parts
SYSTEM_SLICES = 3  # and the system block's


def spacing(length: int, floor: int, slices: int) -> int:
    """The spacing of the points inside a span of `length` tokens: a `slices`-th of it, at
    least `floor`; 0 (none) when the floor is 0."""
    if floor <= 0:
        return 0
    return max(floor, -(-length // slices))


def message_points(
    spans: Iterable[tuple[int, int, int]], most: int, restored: int, size: int
) -> list[int]:
    """The longest `most` points of a prefill from `restored` to `size` tokens, ascending;
    `spans`: (start, end, spacing), a spacing of 0 placing none."""
    points = set()
    for start, end, step in spans:
        if step > 0:
            first = start + step * max(1, (restored - start) // step + 1)
            points.update(range(first, min(end, size), step))
    return sorted(points)[-most:] if most > 0 else []


def check_starts(starts, size: int) -> None:
    """ValueError unless `starts` (PromptLayout.starts) are ints in ascending order (equal
    ones allowed: a message the template renders empty) within [0, size]."""
    last = 0
    for i, start in enumerate(starts):
        if not isinstance(start, (int, np.integer)) or not last <= start <= size:
            raise ValueError(
                f"layout.starts[{i}] is {start!r}: message starts must be ascending token "
                f"indexes within [0, {size}] (the prompt's tokens)"
            )
        last = start
