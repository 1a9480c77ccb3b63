"""The requests in flight: planned, awaiting their commit or release.

A `Flight` is what the manager keeps of a planned request (its prompt, namespace,
session, layout, plan, the anchor it captures and the anchors it indexed early);
`Flights` holds them by request id and answers what the manager asks of them: who
captures an anchor with these tokens (`capturing`), whether a commit matches its
plan (`validated_tokens`), which restore points they pin (`pins`), and asserts what
they hold in the tiers (`check`), and which of them a new prompt should wait for
(`worth_waiting_for`), and the id under which one stores its prompt end early for
those who wait (`prompt_end_id`). A plan made to wait on another request's anchor
capture is `waiting_plan`'s.

Plain Python and numpy: it decides nothing about what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from engine.cache.kinds import CaptureKind, RestoreKind
from engine.cache.messages import Commit, PromptLayout, RestorePlan
from engine.cache.tokens import as_tokens, common_prefix


@dataclass(frozen=True)
class Flight:
    """A planned request awaiting its commit or release."""

    namespace: str
    prompt: np.ndarray
    anchor_len: int
    plan: RestorePlan
    anchor: np.ndarray | None = None  # tokens of the anchor this request captures
    committed: set = field(default_factory=set)  # ids indexed early (anchors, its prompt end)
    layout: PromptLayout = field(default_factory=PromptLayout)
    session: str = ""
    prompt_end: int | None = None  # the id its prompt end is stored under early, once asked

    @property
    def allocated(self) -> tuple[int, ...]:
        """The entry ids it was given: the new entry, the separate-entry captures, then the
        early prompt end's."""
        captures = tuple(c.entry_id for c in self.plan.captures if c.entry_id is not None)
        early = () if self.prompt_end is None else (self.prompt_end,)
        return (self.plan.new_entry_id, *captures, *early)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)


class Flights(dict[str, Flight]):
    """The flights by request id."""

    def capturing(self, namespace: str, anchor: np.ndarray) -> int | None:
        """The id of an anchor with these tokens that a request in flight will capture."""
        for flight in self.values():
            if flight.namespace != namespace or flight.anchor is None:
                continue
            if len(flight.anchor) == len(anchor) and np.array_equal(flight.anchor, anchor):
                return next(
                    c.entry_id for c in flight.plan.captures if c.kind == CaptureKind.ANCHOR
                )
        return None

    def worth_waiting_for(
        self, namespace: str, prompt: np.ndarray, restored: int, gain: int, any_length: bool
    ) -> str | None:
        """The request in flight of `namespace` whose commit would let `prompt` restore at
        least `gain` tokens past `restored` (its best stored point), the furthest first.

        What a flight will hold restorable within the prefix it shares with `prompt`: its
        prompt end when `prompt` extends its prompt whole, the capture points it is planned
        to take at or before the shared length (guard, divergence, message, system; not
        its anchor, which requests wait on mid-prefill: `capturing`), and with no state
        layers any length of its rows. A flight of another namespace never matches (nor,
        the manager being one model's, another model's)."""
        best, furthest = None, restored + max(gain, 1) - 1
        for request_id, flight in self.items():
            if flight.namespace != namespace:
                continue
            shared = common_prefix(flight.prompt, prompt)
            if shared <= furthest:
                continue
            # A point restores at most the prompt's first len - 1 tokens (one is left to
            # prefill), but for the whole prompt at a prompt end (a verbatim resend).
            usable = min(shared, len(prompt) - 1)
            points = [
                c.length
                for c in flight.plan.captures
                if c.length <= usable and c.kind != CaptureKind.ANCHOR
            ]
            if shared == flight.prompt_len:
                points.append(shared)  # its prompt end (a REPLY point)
            elif any_length:
                points.append(usable)  # no state layers: any of its rows
            reach = max(points, default=0)
            if reach > furthest:
                best, furthest = request_id, reach
        return best

    def prompt_end_id(self, request_id: str, prompt: np.ndarray, new_id) -> int | None:
        """The id under which request `request_id` stores its prompt end early, for `prompt`
        waiting on it: allocated (`new_id()`) at the first ask. None when `prompt` does not
        extend its prompt whole (the wait is for a capture point), when its plan stores no
        reply (the prompt end is not a point of its own), or once it stored it already (the
        early entry was evicted since: what is left is its commit)."""
        flight = self[request_id]
        plan = flight.plan
        if not plan.store_reply or plan.new_entry_id is None:
            return None
        if common_prefix(flight.prompt, prompt) < flight.prompt_len:
            return None
        if flight.prompt_end is None:
            self[request_id] = flight = replace(flight, prompt_end=new_id())
        if flight.prompt_end in flight.committed:
            return None
        return flight.prompt_end

    def waiting_on(self, anchor_id: int):
        """(request id, flight) of each request whose plan waits on that anchor."""
        return [(r, f) for r, f in self.items() if f.plan.wait and f.plan.entry_id == anchor_id]

    def pins(self, index) -> dict[str, tuple[int, int]]:
        """The restore points the flights pin in `index`: every source but an anchor still
        being captured (not in the index yet)."""
        pins = {}
        for request_id, flight in self.items():
            source = flight.plan.entry_id
            waiting = flight.plan.wait and source not in index and source not in index.deferred
            if source is not None and not waiting:
                pins[request_id] = (source, flight.plan.length)
        return pins

    def check(self, index, disk_index, has_state_layers: bool) -> None:
        """Assert what the flights hold in the tiers: the ids they were given and did not
        commit are indexed nowhere yet, their pins are the index's, and a pinned restore
        point stays readable (its length is the entry's or one of its checkpoints)."""
        for flight in self.values():
            for entry_id in flight.allocated:
                if entry_id in flight.committed:
                    continue
                assert entry_id not in index and entry_id not in index.deferred, entry_id
                assert disk_index is None or entry_id not in disk_index, entry_id
        pins = self.pins(index)
        assert pins == index.pins, (pins, index.pins)
        for entry_id, length in pins.values():
            entry = index.get(entry_id)
            if entry is not None:
                restorable = length in entry.checkpoints or not has_state_layers
                assert length == entry.length or restorable, (entry_id, length)

    def validated_tokens(self, c: Commit) -> np.ndarray:
        """The commit's tokens as a fresh int32 array; ValueError unless it matches the plan.

        A commit cut short in prefill (cancelled) covers the prefix prefilled so
        far: `prompt_len` below the planned prompt's, no reply, and only the
        captures reached.
        """
        flight = self.get(c.request_id)
        if flight is None:
            raise ValueError(f"commit for request {c.request_id!r}, which has no plan in flight")
        plan = flight.plan
        if (c.entry_id, c.namespace) != (plan.new_entry_id, flight.namespace):
            raise ValueError(
                f"commit {c.request_id!r} stores entry {c.entry_id} in namespace {c.namespace!r}; "
                f"its plan said {plan.new_entry_id} in {flight.namespace!r}"
            )
        if (c.restored_from, c.restored_length) not in ((plan.entry_id, plan.length), (None, 0)):
            raise ValueError(
                f"commit {c.request_id!r} restored ({c.restored_from}, {c.restored_length}), "
                f"plan said ({plan.entry_id}, {plan.length}) (or a cold prefill)"
            )
        tokens = as_tokens(c.tokens, "commit tokens").copy()
        cut_short = c.prompt_len < flight.prompt_len
        exact_length = cut_short or not plan.store_reply  # no reply follows the prompt
        if not 0 < c.prompt_len <= min(flight.prompt_len, len(tokens)) or (
            exact_length and len(tokens) != c.prompt_len
        ):
            raise ValueError(
                f"commit {c.request_id!r} holds {len(tokens)} tokens with prompt_len "
                f"{c.prompt_len} for a planned {flight.prompt_len}-token prompt"
            )
        check_captures(c, plan)
        if c.kv_bytes_per_token < 0 or c.state_bytes < 0:
            raise ValueError(f"commit {c.request_id!r} has negative sizes")
        return tokens


def check_captures(c: Commit, plan: RestorePlan) -> None:
    """ValueError unless the commit's captures are distinct planned ones within its prompt."""
    planned = {(p.length, p.kind, p.entry_id) for p in plan.captures}
    taken = [(p.length, p.kind, p.entry_id) for p in c.captures]
    if len(set(taken)) != len(taken):
        raise ValueError(f"commit {c.request_id!r} reports a capture twice: {c.captures}")
    for point in c.captures:
        if (point.length, point.kind, point.entry_id) not in planned:
            raise ValueError(
                f"commit {c.request_id!r} reports capture {point}, which its plan did not ask for"
            )
        if point.length > c.prompt_len:
            raise ValueError(
                f"commit {c.request_id!r} reports capture {point} past prompt_len {c.prompt_len}"
            )


def waiting_plan(
    plan: RestorePlan, anchor_id: int, anchor_len: int, size: int, guard_min_suffix: int
) -> RestorePlan:
    """`plan` restoring from an anchor still being captured: no anchor capture of its own."""
    guard_ok = size - anchor_len >= guard_min_suffix
    captures = tuple(
        c
        for c in plan.captures
        if c.length > anchor_len
        and c.kind != CaptureKind.ANCHOR
        and (c.kind != CaptureKind.GUARD or guard_ok)
    )
    return replace(
        plan,
        entry_id=anchor_id,
        length=anchor_len,
        kind=RestoreKind.ANCHOR,
        captures=captures,
        load_from_disk=False,
        wait=True,
    )
