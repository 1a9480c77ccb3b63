"""Which prefill chunk runs next: the model actor's prefill policy, in plain Python.

Each step of the batch loop, every decoding sequence decodes (the batch
generator does that unconditionally, first); this module then picks the one
prefill chunk that runs beside it, within a token budget:

- Order: `srpt` runs the sequence with the shortest remaining prefill first,
  aged so a long prompt is never starved: each step it waits since its last
  chunk takes `aging` tokens off its key, so after `remaining / aging` steps
  without a chunk it beats any newcomer. A step is the caller's clock: the
  model loop counts chunks picked, not its decode steps (with a chunk on a
  thread of its own many decode steps pass during one, and aging by them let
  two long prompts of similar length take turns chunk by chunk, each ending
  near the end of both). The credit is spent by the chunk it
  wins (aging from arrival would make an old prompt win every step until
  its end, and a short turn arriving late would wait for all of it). `fifo`
  runs them in arrival order.
- Bound (`srpt` with `wait_bound` X > 0): aging alone lets a long prompt
  among a stream of short ones win a chunk only every `remaining / aging`
  steps, so its prefill takes time quadratic in its length. The bound
  measures time (`clock`) in prompt tokens, each chunk also charged its
  overhead in tokens' worth: its forward's fixed cost, and the decode step
  it shares when it runs inside one, over the learned cost per token
  (engine.runtime.batching.chunk_costs). A sequence first seen with work W
  pending (its own prefill, and all of every sequence seen before it, each
  priced as first-come-first-served would run it: in `chunk_max`-token
  forwards, each with its overhead, as a peer runs a decode step between its
  prefill steps) gets the deadline `clock + X * W`. The SRPT chunk runs if,
  after it, serving the earliest deadlines first (each remainder priced the
  same way) would still meet every deadline; otherwise the earliest
  deadline's chunk runs, alone, in `chunk_max` tokens (EDF meets any
  deadlines that can be met, and these are the chunks it was priced at:
  where the bound presses, the prefill's rate comes before the streams'
  gaps). So no prefill ends later than X times its first-come-first-served
  end, in time and not only in tokens: the fixed costs of many small chunks
  and the decode steps between them count (a started cohort's other members
  riding along aside: one chunk). Tokens' worth rather than milliseconds:
  a machine slowed or sped up as a whole (a load) moves no deadline, and
  until a cost is measured the clock counts tokens alone. X = 1 is
  first-come-first-served. A sequence is first seen when it may start (the
  batch has room for it); a wait for room is decode's, not this.
- A sequence whose next capture point is an anchor that other requests wait
  on is keyed by the tokens up to that point: the waiters restore the anchor
  in the step after it is captured, instead of prefilling it again.
- No padding: every sequence of a chunk gets the same number of tokens. A
  chunk is one sequence, or (when `group` > 1) several that have not started
  and whose remaining prefills are within `GROUP_RATIO` of each other; once
  started they stay one prompt batch (a cohort) and run together.
- Budget, in time: a chunk is sized from learned costs (a forward's fixed
  cost plus its cohort's milliseconds per prefill token at its current
  context; engine.runtime.batching.chunk_costs fits both to the chunks run,
  on whatever backend), so `fixed + token_ms * tokens` converges on the time
  it is given. While sequences decode, that time is the streams' gap budget:
  inside a decode step (no `overlap`), what keeps the whole step within
  `step_factor` idle decode steps (the step's other work, measured, taken
  off); with `overlap` (the chunk's forward on a thread of its own beside the
  decode steps, engine.runtime.batching.chunked), `slice_ms` less a decode
  step (a stream beside a chunk evaluated whole waits for the chunk, then
  for its own step). With nothing decoding it is `slice_ms`, so a newcomer
  waits at most about that long for the chunk in flight. Never more than
  `chunk_max` tokens (default: `budget`), never fewer than MIN_CHUNK (the
  long prompt always moves).
- The floor: no chunk is shorter than its fixed cost pays for. It keeps the
  prefill at 1 / X of its own rate at least (X: the wait bound, else 1 / (1
  - USEFUL)): a chunk of time T beside other work `other` gives the prefill
  (T - fixed) / (T + other) of the machine, so T >= (X * fixed + other) /
  (X - 1). Where the gap budget is shorter (a forward's fixed cost several
  decode steps long, a Mac's MoE; or one a large share of the budget, as
  where tokens are cheap), the chunk takes the floor's time and is
  background work (`Chunk.background`): it leaves the streams the machine
  as it goes, so their gaps stay short either way, and the prefill's
  capacity is not spent on fixed costs (sized to the budget alone, chunks
  shrank until the fixed cost was half of each, and the cold prompts were
  slower by a third). A background chunk may pay another fixed cost than one
  evaluated whole (the worker evaluates it module by module: a hand-off per
  module, on the CPU 34.5 ms against 8): where it is learned apart
  (`Costs.background_fixed_ms`), the floor of a background chunk is priced at
  it, so no chunk is mostly the fixed cost it pays (priced at the whole
  forward's, or at one fit through both kinds, a background chunk came out a
  third fixed cost).
- Growth: a long prefill that nobody else waits for (no other sequence has
  prefill left) while no stream decodes doubles its chunk's time each chunk
  in a row (from the slice) until the fixed cost is `fixed_share` of it (at
  least twice the slice, so the sizes vary for the fit); a sequence that
  arrives or a stream that starts decoding cuts it back, and growth starts
  over once it is alone again. Beside decoding streams a chunk within their
  gap budget never grows: their gaps are what it is sized to. A background
  chunk beside them that is evaluated module by module (its fixed cost
  learned apart: `Costs.background_fixed_ms`) grows the same way while
  nobody else waits: it leaves the streams the machine as it goes whatever
  its length, so its length costs only a newcomer's wait for
  the chunk in flight, and nobody is waiting (sized to the floor alone, a
  cold prompt beside streams paid a fifth of its chunks' time in fixed
  costs where mlx-vlm pays one per 2,048 tokens). There, until the fit tells the fixed
  cost apart, every other chunk is half the size (two tokens for one), so
  the sizes vary for it (chunks of one size would never tell it, and a
  one-token chunk would read its whole fixed cost as the cost of a token).
- A short prefill (its whole uncached prompt within `budget` tokens) runs
  whole in one chunk (`Chunk.whole`) when nothing decodes, or when its whole
  cost fits the time a chunk of it would get anyway (the gap budget or the
  floor): its first token comes one step later instead of many. Otherwise,
  beside decoding streams, it is cut like any chunk (its first token a few
  chunks' fixed costs later, instead of one long gap for every stream); run
  whole but longer than the gap budget, it is background work too. The
  tail of a long prompt is not short: it has
  waited anyway, and at a long context its last `budget` tokens would stall
  the streams longest.

It knows sequences only as uids with token counts and step numbers, and keeps
only the work counter and each sequence's deadline; nothing here touches MLX,
a cache or a clock (`next_chunk` must be called once per chunk that runs).
`batched` (mlx-lm's own padded prefill batch, the baseline) does not use this
module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

AGING = 16  # tokens taken off a waiting sequence's key per step
GROUP_RATIO = 1.5  # grouped sequences' remaining prefills differ at most by this factor
MIN_CHUNK = 1  # a long prefill moves at least this many tokens per step
STEP_FACTOR = 2.5  # a step with a chunk beside decode aims at this many idle decode steps
SLICE_MS = 50.0  # a chunk aims at this long with nothing decoding, or beside decode (overlap)
FIRST_CHUNK = 16  # a long prefill's chunk beside decode before any cost is measured
USEFUL = 0.5  # without a wait bound, a chunk keeps the prefill at least this share of its rate
FIXED_SHARE = 0.1  # a long prefill alone grows its chunks until its fixed cost is this share
# (the default of `fixed_share`; chunked.py's floor on a chunk's cost beyond its fixed part)
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
    """What prefills this step: `tokens` prompt tokens of each of `uids` (none padded);
    `whole`: a short prefill run whole (its first token is the wait that matters);
    `background`: beside decoding streams, longer than their gap budget (the floor, the
    bound's chunk, or before a cost is measured), so it must leave them the machine as it
    goes (engine.runtime.batching.prefill_worker evaluates it module by module)."""

    uids: tuple[int, ...]
    tokens: int
    whole: bool = False
    # Longer than the streams' gap budget (from the costs; not part of what it prefills).
    background: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Costs:
    """Measured recently by the batch generator (ms; 0: not measured yet)."""

    decode_ms: float = 0.0  # a step that only decoded: a stream's idle inter-token gap
    token_ms: float = 0.0  # a prefill token beyond a chunk's fixed cost, of any cohort
    beside_ms: float = 0.0  # what a step with a chunk spends besides the chunk's forward
    fixed_ms: float = 0.0  # a chunk's fixed cost, whatever its size (chunk_costs); 0: unknown
    # A background chunk's fixed cost, learned apart where it is evaluated otherwise (module
    # by module: a hand-off per module); None: as `fixed_ms`; 0: not told apart yet.
    background_fixed_ms: float | None = None

    def fixed(self, background: bool) -> float:
        """The fixed cost a chunk pays, background or not (0: unknown); a background chunk's
        until told apart: a whole one's."""
        if background and self.background_fixed_ms:
            return self.background_fixed_ms
        return self.fixed_ms


class PrefillScheduler:
    """The prefill policy (module doc); `next_chunk` once per step."""

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
        fixed_share: float = FIXED_SHARE,
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
        if not 0 < fixed_share < 1:
            raise ValueError(f"fixed_share {fixed_share} must be between 0 and 1")
        self.fixed_share = fixed_share
        self.streak: tuple[int, int] = (-1, 0)  # (uid, its chunks in a row with nothing waiting)
        self.picked = 0  # chunks picked: every other one probes the fit (module doc: growth)
        self.clock = 0.0  # every chunk picked, in tokens' worth: the bound's clock (module doc)
        self.deadlines: dict[int, float] = {}  # uid -> the clock by which its prefill ends

    # ---- the bound: tokens, and each chunk's overhead in tokens' worth -----------------

    def _other_ms(self, decoding: int, costs: Costs) -> float:
        """What a step with a chunk spends besides the chunk, when the chunk is part of it."""
        return costs.beside_ms if decoding and not self.overlap else 0.0

    @staticmethod
    def _worth(ms: float, costs: Costs) -> float:
        """`ms` in prompt tokens' worth (0 until a cost per token is measured)."""
        return ms / costs.token_ms if costs.token_ms > 0 else 0.0

    def _remainder(self, tokens: int, costs: Costs) -> float:
        """`tokens` more of a prefill in `chunk_max`-token chunks, each with its overhead
        (its fixed cost, and a step's other work when chunks run inside steps): as
        first-come-first-served runs a prompt (a decode step between its prefill steps),
        and as the bound's own chunks run it. Whether streams decode at this moment does
        not change the price: a deadline set while none did must hold when one starts."""
        if tokens <= 0:
            return 0.0
        per_chunk = costs.fixed_ms + (0.0 if self.overlap else costs.beside_ms)
        return tokens + self._worth(per_chunk, costs) * math.ceil(tokens / self.chunk_max)

    def chunk_cost(self, chunk: Chunk, decoding: int, costs: Costs) -> float:
        """What `chunk` costs the bound's clock: its tokens, and its overhead's worth."""
        overhead = costs.fixed(chunk.background) + self._other_ms(decoding, costs)
        return chunk.tokens * len(chunk.uids) + self._worth(overhead, costs)

    def _deadlines(self, candidates: list[Candidate], costs: Costs) -> None:
        """Give each sequence seen for the first time its deadline (module doc: bound);
        forget those gone."""
        present = {c.uid for c in candidates}
        self.deadlines = {u: d for u, d in self.deadlines.items() if u in present}

        pending = sum(
            self._remainder(c.remaining, costs) for c in candidates if c.uid in self.deadlines
        )
        for c in sorted(candidates, key=lambda c: (c.arrived, c.uid)):
            if c.uid not in self.deadlines:
                pending += self._remainder(c.remaining, costs)
                self.deadlines[c.uid] = self.clock + self.wait_bound * pending

    def _feasible(self, ready: list[Candidate], chunk: Chunk, cost: float, costs: Costs) -> bool:
        """Whether, after `chunk` (`cost` on the clock), serving the earliest deadlines first
        still meets them all."""
        ahead = self.clock + cost
        for c in sorted(ready, key=lambda c: (self.deadlines[c.uid], c.arrived, c.uid)):
            left = c.remaining - (chunk.tokens if c.uid in chunk.uids else 0)
            ahead += self._remainder(left, costs)
            if ahead > self.deadlines[c.uid]:
                return False
        return True

    # ---- order and size -----------------------------------------------------------

    def priority(self, c: Candidate, step: int) -> tuple:
        """Sort key: the smallest runs first."""
        if self.schedule == "fifo":
            return (c.arrived, c.uid)
        work = c.remaining if c.unblocks is None else min(c.remaining, c.unblocks)
        since = c.arrived if c.waiting_since is None else c.waiting_since
        return (work - self.aging * (step - since), c.arrived, c.uid)

    def short(self, total: int) -> bool:
        """A prefill of `total` tokens is short: it may run whole (module doc)."""
        return total <= self.budget

    def gap_ms(self, decoding: int, costs: Costs) -> float:
        """The time a chunk is given: beside decoding streams their gap budget, else the
        slice (module doc: budget, in time). With overlap a stream's gap beside a chunk
        evaluated whole is the chunk and then its own decode step: the slice less a step."""
        if decoding and not self.overlap:
            return self.step_factor * costs.decode_ms - costs.beside_ms
        if decoding:
            return max(0.0, self.slice_ms - costs.decode_ms)
        return self.slice_ms

    def floor_ms(self, decoding: int, costs: Costs, fixed: float | None = None) -> float:
        """The shortest chunk worth its fixed cost (`fixed`, else a chunk evaluated whole's)
        and its step's other work (module doc: the floor); 0 while neither is known."""
        x = self.wait_bound if self.wait_bound > 1 else 1 / (1 - USEFUL)
        fixed = costs.fixed_ms if fixed is None else fixed
        return (x * fixed + self._other_ms(decoding, costs)) / (x - 1)

    def room(self, decoding: int, costs: Costs) -> tuple[float, float, bool]:
        """(the time a chunk gets, the fixed cost it pays, whether it is background): the gap
        budget where the floor fits in it, else the floor at a background chunk's fixed
        cost (module doc: the floor)."""
        gap, floor = self.gap_ms(decoding, costs), self.floor_ms(decoding, costs)
        if not decoding or floor <= gap:
            return max(gap, floor), costs.fixed_ms, False
        fixed = costs.fixed(True)
        return max(gap, self.floor_ms(decoding, costs, fixed)), fixed, True

    def whole(self, head: Candidate, decoding: int, costs: Costs) -> bool:
        """`head` is a short prefill that runs whole this step (module doc)."""
        total = head.remaining if head.total is None else head.total
        if not self.short(total):
            return False
        token_ms = head.token_ms or costs.token_ms
        if not decoding or token_ms <= 0:
            return True  # no gap to keep, or no cost to tell it by
        room, fixed, _ = self.room(decoding, costs)
        return fixed + token_ms * total <= room  # cut, it would get no less

    def allowance(
        self,
        head: Candidate,
        decoding: int,
        costs: Costs,
        alone: bool = False,
        streak: int = 0,
        urgent: bool = False,
    ) -> int:
        """Prompt tokens `head` may prefill this step (module doc: budget, floors, growth).
        `alone`: no other sequence waits for a chunk; `streak`: its chunks in a row so;
        `urgent`: the bound presses."""
        if self.whole(head, decoding, costs):
            return self.budget
        token_ms = head.token_ms or costs.token_ms
        if token_ms <= 0 or (decoding and not self.overlap and costs.decode_ms <= 0):
            return min(self.budget, FIRST_CHUNK) if decoding else self.budget
        if urgent:  # the bound presses: its rate first (module doc)
            return self.chunk_max
        room, fixed, background = self.room(decoding, costs)  # the floor (module doc)
        apart = background and bool(costs.background_fixed_ms)  # by module, told apart
        if alone and streak and (not decoding or apart):
            # Nobody waits: double the time each chunk in a row, until the fixed cost is
            # `fixed_share` of it (at least twice the slice, so the fit sees sizes vary).
            room = min(room * 2**streak, max(2 * room, fixed / self.fixed_share))
        tokens = max(MIN_CHUNK, min(self.chunk_max, int((room - fixed) / token_ms)))
        unknown = costs.fixed_ms <= 0 or (background and costs.background_fixed_ms == 0)
        if decoding and unknown and self.picked % 2:  # the fit needs sizes that vary
            tokens = tokens // 2 if tokens > 1 else 2
        return tokens

    def next_chunk(
        self, candidates: list[Candidate], step: int, decoding: int = 0, costs: Costs = Costs()
    ) -> Chunk | None:
        """The chunk to prefill this step, or None when nothing waits."""
        ready = sorted(
            (c for c in candidates if c.remaining > 0), key=lambda c: self.priority(c, step)
        )
        if not ready:
            return None
        chunk = self._chunk(ready[0], ready, ready, candidates, decoding, costs)
        cost = self.chunk_cost(chunk, decoding, costs)
        if self.schedule == "srpt" and self.wait_bound:
            self._deadlines(candidates, costs)
            if not self._feasible(ready, chunk, cost, costs):
                # The earliest deadline first, alone, in a chunk of the bound's size.
                head = min(ready, key=lambda c: (self.deadlines[c.uid], c.arrived, c.uid))
                chunk = self._chunk(head, [head], ready, candidates, decoding, costs, True)
                cost = self.chunk_cost(chunk, decoding, costs)
        self.clock += cost
        self.picked += 1
        by_module = chunk.background and costs.background_fixed_ms is not None
        alone = all(c.uid in chunk.uids for c in ready) and (not decoding or by_module)
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
        urgent: bool = False,
    ) -> Chunk:
        """`head`'s chunk: its cohort, or it and similar unstarted ones of `ready` (`waiting`:
        every sequence with prefill left, to tell whether anyone else waits)."""
        own = {head.uid}
        if head.cohort is not None:
            own |= {c.uid for c in candidates if c.cohort == head.cohort}
        alone = all(c.uid in own for c in waiting)
        streak = self.streak[1] if self.streak[0] in own else 0
        allowance = self.allowance(head, decoding, costs, alone, streak, urgent)
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
        whole = all(self.whole(c, decoding, costs) for c in members)
        token_ms = head.token_ms or costs.token_ms
        ms = costs.fixed_ms + token_ms * tokens * len(members) if token_ms > 0 else float("inf")
        background = bool(decoding) and ms > self.gap_ms(decoding, costs)
        uids = tuple(c.uid for c in members)
        return Chunk(uids=uids, tokens=tokens, whole=whole, background=background)
