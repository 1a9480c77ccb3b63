"""Which prefill chunk runs next: the model actor's prefill policy, in plain Python.

Each step of the batch loop, every decoding sequence decodes (the batch
generator does that unconditionally, first); this module then picks the one
prefill chunk that runs beside it, within a token budget:

- Order: `srpt` runs the sequence with the shortest remaining prefill first,
  aged so a long prompt is never starved (each step waited takes `aging`
  tokens off its key, so after `remaining / aging` steps it beats any
  newcomer). `fifo` runs them in arrival order.
- A sequence whose next capture point is an anchor that other requests wait
  on is keyed by the tokens up to that point: the waiters restore the anchor
  in the step after it is captured, instead of prefilling it again.
- No padding: every sequence of a chunk gets the same number of tokens. A
  chunk is one sequence, or (when `group` > 1) several that have not started
  and whose remaining prefills are within `GROUP_RATIO` of each other; once
  started they stay one prompt batch (a cohort) and run together.
- Budget: at most `budget` prompt tokens per step; while sequences decode,
  also at most what keeps the step's prefill under `itl_factor` decode-only
  steps (from the measured costs; a token's cost includes its share of the
  fixed cost of a forward, so the share converges on the time it is given),
  so a decoding stream's inter-token latency stays within (1 + itl_factor)
  idle steps.

It knows sequences only as uids with token counts and step numbers; nothing
here touches MLX, a cache or a clock. `batched` (mlx-lm's own padded prefill
batch, the baseline) does not use this module.
"""

from __future__ import annotations

from dataclasses import dataclass

AGING = 16  # tokens taken off a waiting sequence's key per step
GROUP_RATIO = 1.5  # grouped sequences' remaining prefills differ at most by this factor
MIN_CHUNK = 4  # a step's prefill share never drops below this while decoding
ITL_FACTOR = 2.0  # prefill time per step, in decode steps, while sequences decode


@dataclass(frozen=True)
class Candidate:
    """A sequence waiting for or in prefill, as the policy sees it."""

    uid: int
    remaining: int  # prompt tokens still to prefill (the last one goes with the first decode)
    boundary: int  # tokens to its next segment end: a capture point, or the prompt end
    arrived: int  # the step it arrived in
    cohort: int | None = None  # the prompt batch it prefills in; None: not started
    unblocks: int | None = None  # tokens until it captures an anchor others wait on


@dataclass(frozen=True)
class Chunk:
    """What prefills this step: `tokens` prompt tokens of each of `uids` (none padded)."""

    uids: tuple[int, ...]
    tokens: int


@dataclass(frozen=True)
class Costs:
    """Measured recently by the batch generator: a decode-only step, one prefill token."""

    decode_ms: float = 0.0
    token_ms: float = 0.0


class PrefillScheduler:
    """The prefill policy (module doc); `plan` once per step."""

    def __init__(
        self,
        schedule: str,
        budget: int,
        group: int = 1,
        aging: int = AGING,
        itl_factor: float = ITL_FACTOR,
    ):
        if schedule not in ("srpt", "fifo"):
            raise ValueError(f"schedule {schedule!r} is not srpt or fifo")
        if budget < 1 or group < 1:
            raise ValueError(f"budget {budget} and group {group} must be positive")
        self.schedule, self.budget, self.group = schedule, budget, group
        self.aging, self.itl_factor = aging, itl_factor

    def priority(self, c: Candidate, step: int) -> tuple:
        """Sort key: the smallest runs first."""
        if self.schedule == "fifo":
            return (c.arrived, c.uid)
        work = c.remaining if c.unblocks is None else min(c.remaining, c.unblocks)
        return (work - self.aging * (step - c.arrived), c.arrived, c.uid)

    def allowance(self, decoding: int, costs: Costs) -> int:
        """Prompt tokens this step may prefill."""
        if not decoding or costs.token_ms <= 0:
            return self.budget
        fits = int(self.itl_factor * costs.decode_ms / costs.token_ms)
        return max(1, min(self.budget, max(MIN_CHUNK, fits)))

    def plan(
        self, candidates: list[Candidate], step: int, decoding: int = 0, costs: Costs = Costs()
    ) -> Chunk | None:
        """The chunk to prefill this step, or None when nothing waits."""
        ready = sorted(
            (c for c in candidates if c.remaining > 0), key=lambda c: self.priority(c, step)
        )
        if not ready:
            return None
        head = ready[0]
        allowance = self.allowance(decoding, costs)
        if head.cohort is not None:  # a started cohort runs whole: one prompt batch
            members = [c for c in candidates if c.cohort == head.cohort]
        else:
            similar = [
                c
                for c in ready[1:]
                if c.cohort is None
                and head.remaining <= GROUP_RATIO * c.remaining
                and c.remaining <= GROUP_RATIO * head.remaining
            ]
            members = [head] + similar[: max(0, min(self.group, allowance) - 1)]
        tokens = min(min(c.boundary for c in members), max(1, allowance // len(members)))
        return Chunk(uids=tuple(c.uid for c in members), tokens=tokens)
