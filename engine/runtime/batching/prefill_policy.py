"""Which prefill chunk runs next: the model actor's prefill policy, in plain Python.

Each step of the batch loop, every decoding sequence decodes (the batch
generator does that unconditionally, first); this module then picks the one
prefill chunk that runs beside it, within a token budget:

- Order: `srpt` runs the sequence with the shortest remaining prefill first,
  aged so a long prompt is never starved: each step it waits since its last
  chunk takes `aging` tokens off its key, so after `remaining / aging` steps
  without a chunk it beats any newcomer. The credit is spent by the chunk it
  wins (aging from arrival would make an old prompt win every step until
  its end, and a short turn arriving late would wait for all of it). `fifo`
  runs them in arrival order.
- Bound (`srpt` with `wait_bound` X > 0): aging alone lets a long prompt
  among a stream of short ones win a chunk only every `remaining / aging`
  steps, so its prefill takes time quadratic in its length. The bound
  measures time in prompt tokens of the chunks planned (`work`): a sequence
  first seen with W tokens of prefill pending (its own, and all of every
  sequence seen before it, as first-come-first-served would run them) gets
  the deadline `work + X * W`. The SRPT chunk runs if, after it, serving the
  earliest deadlines first would still meet every deadline; otherwise the
  earliest deadline's chunk runs, alone (EDF meets any deadlines that can be
  met). So no prefill ends later than X times its first-come-first-served
  end (a started cohort's other members riding along aside: one chunk).
  X = 1 is first-come-first-served. A sequence is first seen when it may
  start (the batch has room for it); a wait for room is decode's, not this.
- A sequence whose next capture point is an anchor that other requests wait
  on is keyed by the tokens up to that point: the waiters restore the anchor
  in the step after it is captured, instead of prefilling it again.
- No padding: every sequence of a chunk gets the same number of tokens. A
  chunk is one sequence, or (when `group` > 1) several that have not started
  and whose remaining prefills are within `GROUP_RATIO` of each other; once
  started they stay one prompt batch (a cohort) and run together.
- Budget, in time: a chunk is sized from measured costs (its own cohort's
  milliseconds per prefill token at its current context, a forward's fixed
  cost included, so the size converges on the time it is given). While
  sequences decode, a long prefill's chunk gets what keeps the whole step
  within `step_factor` idle decode steps (the step's other work, measured,
  taken off), so a decoding stream's inter-token gap stays near that; with
  nothing decoding it gets `slice_ms`, so a newcomer waits at most about
  that long for the chunk in flight. With `overlap` (the chunk's forward runs
  on a thread of its own beside the decode steps, engine.runtime.batching.chunked) the
  chunk is no part of a step: it gets `slice_ms` whether or not sequences
  decode. Never more than `chunk_max` tokens (default: `budget`), never
  fewer than MIN_CHUNK (the long prompt always moves). The time is the
  guard; `chunk_max` only caps the chunk where tokens are cheap, and the
  smaller it is, the more of the prefill goes to each chunk's fixed cost
  and to the steps between one chunk's end and the next one's start.
- Costs, learned: a chunk's forward is a fixed cost plus a cost per token
  (engine.runtime.batching.chunk_costs fits both to the chunks run, on
  whatever backend), and the chunk is sized on the per-token part after the
  fixed one. Once the fixed cost is known, no chunk is so short that the
  prefill runs below 1 / X of its own rate (X: the wait bound, else
  1 / (1 - USEFUL)): with the step's other work (the decode, when the chunk is
  part of the step) and the fixed cost, a chunk of time T gives the prefill
  (T - fixed) / (T + other) of the machine, so T >= (X * fixed + other) /
  (X - 1). Where a forward's fixed cost is several decode steps long (a
  Mac's MoE) that outweighs the streams' gap target: the bound's promise is
  kept in time, not only in tokens.
- Growth: a long prefill that nobody else waits for (no other sequence has
  prefill left), with its chunk not part of a decode step, doubles its
  chunk's time each chunk in a row (from the slice) until the fixed cost is
  FIXED_SHARE of it (at least twice the slice, so the sizes vary for the
  fit); a sequence that arrives cuts it back to the slice, and growth starts
  over once it is alone again.
- A short prefill (its whole uncached prompt within `budget` tokens) runs
  whole in one chunk, also beside decode: its first token comes one step
  later instead of many, at the price of one longer gap for the decoding
  streams. The tail of a long prompt is not short: it has waited anyway,
  and at a long context its last `budget` tokens would stall them longest.

It knows sequences only as uids with token counts and step numbers, and keeps
only the work counter and each sequence's deadline; nothing here touches MLX,
a cache or a clock (`plan` must be called once per chunk that runs).
`batched` (mlx-lm's own padded prefill batch, the baseline) does not use this
module.
"""

from __future__ import annotations

from dataclasses import dataclass

AGING = 16  # tokens taken off a waiting sequence's key per step
GROUP_RATIO = 1.5  # grouped sequences' remaining prefills differ at most by this factor
MIN_CHUNK = 1  # a long prefill moves at least this many tokens per step
STEP_FACTOR = 2.5  # a step with a chunk beside decode aims at this many idle decode steps
SLICE_MS = 50.0  # a long prefill's chunk with nothing decoding aims at this long
FIRST_CHUNK = 16  # a long prefill's chunk beside decode before any cost is measured
USEFUL = 0.5  # without a wait bound, a prefill beside other work keeps this share of its rate
FIXED_SHARE = 0.1  # a long prefill alone grows its chunks until its fixed cost is this share
WAIT_BOUND = 2.0  # srpt: no prefill ends later than this many times first-come-first-served's


@dataclass(frozen=True)
class Candidate:
    """A sequence waiting for or in prefill, as the policy sees it."""

    uid: int
    remaining: int  # prompt tokens still to prefill (the last one goes with the first decode)
    boundary: int  # tokens to its next segment end: a capture point, or the prompt end
    arrived: int  # the step it arrived in
    cohort: int | None = None  # the prompt batch it prefills in; None: not started
    unblocks: int | None = None  # tokens until it captures an anchor others wait on
    token_ms: float = 0.0  # its cohort's measured ms per prefill token; 0: not yet
    waiting_since: int | None = None  # the step of its last chunk; None: `arrived`
    total: int | None = None  # its whole prefill (from its restore point); None: `remaining`


@dataclass(frozen=True)
class Chunk:
    """What prefills this step: `tokens` prompt tokens of each of `uids` (none padded)."""

    uids: tuple[int, ...]
    tokens: int


@dataclass(frozen=True)
class Costs:
    """Measured recently by the batch generator (ms; 0: not measured yet)."""

    decode_ms: float = 0.0  # a step that only decoded: a stream's idle inter-token gap
    token_ms: float = 0.0  # a prefill token beyond a chunk's fixed cost, of any cohort
    beside_ms: float = 0.0  # what a step with a chunk spends besides the chunk's forward
    fixed_ms: float = 0.0  # a chunk's fixed cost, whatever its size (chunk_costs); 0: unknown


class PrefillScheduler:
    """The prefill policy (module doc); `plan` once per step."""

    def __init__(
        self,
        schedule: str,
        budget: int,
        group: int = 1,
        aging: int = AGING,
        step_factor: float = STEP_FACTOR,
        slice_ms: float = SLICE_MS,
        overlap: bool = False,
        wait_bound: float = WAIT_BOUND,
        chunk_max: int | None = None,
    ):
        if schedule not in ("srpt", "fifo"):
            raise ValueError(f"schedule {schedule!r} is not srpt or fifo")
        if budget < 1 or group < 1:
            raise ValueError(f"budget {budget} and group {group} must be positive")
        if wait_bound != 0 and not wait_bound >= 1:
            raise ValueError(f"wait bound {wait_bound} must be 0 (off) or at least 1")
        self.schedule, self.budget, self.group = schedule, budget, group
        self.aging, self.step_factor, self.slice_ms = aging, step_factor, slice_ms
        self.overlap, self.wait_bound = overlap, wait_bound
        self.chunk_max = budget if chunk_max is None else chunk_max
        if self.chunk_max < 1:
            raise ValueError(f"chunk_max {chunk_max} must be positive")
        self.streak: tuple[int, int] = (-1, 0)  # (uid, its chunks in a row with nothing waiting)
        self.work = 0  # prompt tokens of every chunk planned: the bound's clock
        self.deadlines: dict[int, float] = {}  # uid -> the work by which its prefill ends

    def _deadlines(self, candidates: list[Candidate]) -> None:
        """Give each sequence seen for the first time its deadline (module doc: bound);
        forget those gone."""
        present = {c.uid for c in candidates}
        self.deadlines = {u: d for u, d in self.deadlines.items() if u in present}
        pending = sum(c.remaining for c in candidates if c.uid in self.deadlines)
        for c in sorted(candidates, key=lambda c: (c.arrived, c.uid)):
            if c.uid not in self.deadlines:
                pending += c.remaining
                self.deadlines[c.uid] = self.work + self.wait_bound * pending

    def _feasible(self, ready: list[Candidate], chunk: Chunk) -> bool:
        """Whether, after `chunk`, serving the earliest deadlines first still meets them all."""
        ahead = self.work + chunk.tokens * len(chunk.uids)
        for c in sorted(ready, key=lambda c: (self.deadlines[c.uid], c.arrived, c.uid)):
            ahead += max(0, c.remaining - (chunk.tokens if c.uid in chunk.uids else 0))
            if ahead > self.deadlines[c.uid]:
                return False
        return True

    def priority(self, c: Candidate, step: int) -> tuple:
        """Sort key: the smallest runs first."""
        if self.schedule == "fifo":
            return (c.arrived, c.uid)
        work = c.remaining if c.unblocks is None else min(c.remaining, c.unblocks)
        since = c.arrived if c.waiting_since is None else c.waiting_since
        return (work - self.aging * (step - since), c.arrived, c.uid)

    def short(self, total: int) -> bool:
        """A prefill of `total` tokens is short: it runs whole, and it is never background work
        (engine.runtime.batching.prefill_worker evaluates only a long one's chunks module by
        module)."""
        return total <= self.budget

    def allowance(
        self, head: Candidate, decoding: int, costs: Costs, alone: bool = False, streak: int = 0
    ) -> int:
        """Prompt tokens `head` may prefill this step (module doc: budget, in time; growth).
        `alone`: no other sequence waits for a chunk; `streak`: its chunks in a row so."""
        if self.short(head.remaining if head.total is None else head.total):
            return self.budget  # whole, decoding or not
        token_ms = head.token_ms or costs.token_ms
        if token_ms <= 0 or (decoding and not self.overlap and costs.decode_ms <= 0):
            return min(self.budget, FIRST_CHUNK) if decoding else self.budget
        in_step = decoding and not self.overlap  # the chunk is part of a decode step
        if in_step:
            room = self.step_factor * costs.decode_ms - costs.beside_ms
        else:
            room = self.slice_ms
        fixed = costs.fixed_ms
        if fixed > 0:  # known (the fit told it apart): the prefill keeps its rate (module doc)
            x = self.wait_bound if self.wait_bound > 1 else 1 / (1 - USEFUL)
            room = max(room, (x * fixed + (costs.beside_ms if in_step else 0.0)) / (x - 1))
        if alone and not in_step and streak:
            # Nobody waits: double the time each chunk in a row, until the fixed cost is
            # FIXED_SHARE of it (at least twice the slice, so the fit sees sizes vary).
            room = min(room * 2**streak, max(2 * room, fixed / FIXED_SHARE))
        return max(MIN_CHUNK, min(self.chunk_max, int((room - fixed) / token_ms)))

    def plan(
        self, candidates: list[Candidate], step: int, decoding: int = 0, costs: Costs = Costs()
    ) -> Chunk | None:
        """The chunk to prefill this step, or None when nothing waits."""
        ready = sorted(
            (c for c in candidates if c.remaining > 0), key=lambda c: self.priority(c, step)
        )
        if not ready:
            return None
        chunk = self._chunk(ready[0], ready, ready, candidates, decoding, costs)
        if self.schedule == "srpt" and self.wait_bound:
            self._deadlines(candidates)
            if not self._feasible(ready, chunk):  # the earliest deadline first, alone
                head = min(ready, key=lambda c: (self.deadlines[c.uid], c.arrived, c.uid))
                chunk = self._chunk(head, [head], ready, candidates, decoding, costs)
        self.work += chunk.tokens * len(chunk.uids)
        alone = all(c.uid in chunk.uids for c in ready)
        uid, count = self.streak
        self.streak = (chunk.uids[0], count + 1 if alone and uid == chunk.uids[0] else int(alone))
        return chunk

    def _chunk(
        self,
        head: Candidate,
        ready: list[Candidate],
        waiting: list[Candidate],
        candidates: list[Candidate],
        decoding: int,
        costs: Costs,
    ) -> Chunk:
        """`head`'s chunk: its cohort, or it and similar unstarted ones of `ready` (`waiting`:
        every sequence with prefill left, to tell whether anyone else waits)."""
        own = {head.uid}
        if head.cohort is not None:
            own |= {c.uid for c in candidates if c.cohort == head.cohort}
        alone = all(c.uid in own for c in waiting)
        streak = self.streak[1] if self.streak[0] in own else 0
        allowance = self.allowance(head, decoding, costs, alone, streak)
        if head.cohort is not None:  # a started cohort runs whole: one prompt batch
            members = [c for c in candidates if c.cohort == head.cohort]
        else:
            similar = [
                c
                for c in ready
                if c is not head
                and c.cohort is None
                and head.remaining <= GROUP_RATIO * c.remaining
                and c.remaining <= GROUP_RATIO * head.remaining
            ]
            members = [head] + similar[: max(0, min(self.group, allowance) - 1)]
        tokens = min(min(c.boundary for c in members), max(1, allowance // len(members)))
        return Chunk(uids=tuple(c.uid for c in members), tokens=tokens)
