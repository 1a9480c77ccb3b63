"""One model's serving loop, simulated on a machine's costs: our prefill policy, or FCFS.

- `ours`: the engine's own PrefillScheduler (engine.runtime.batching.prefill_policy,
  its defaults) picks each step's chunk beside the decode batch, as
  `--schedule srpt` does with the chunk inside the step (one GPU runs one
  forward at a time); what it is told are the costs it would measure: the
  chunks' fit (engine.runtime.batching.chunk_costs), the decode-only steps.
- `fcfs`: first come, first served, each prompt prefilled whole, in chunks of
  `prefill_step` tokens back to back while every stream waits: what mlx-vlm's
  server does.
Both share everything else: the costs (clients.bench.simulate.costs), the batch
limit, and a prefix cache of every prompt prefilled so far (a prompt restores
its longest stored prefix, less one token; stored at its prompt end, as both
servers do). A request's first token comes with the first decode step after its
prompt ends. It knows the policy and the costs; no clock, no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.config import ModelConfig
from engine.runtime.batching.chunk_costs import ChunkCosts, TokenRate
from engine.runtime.batching.prefill_policy import (
    FIXED_SHARE,
    Candidate,
    Costs,
    PrefillScheduler,
)

EWMA = 0.3


@dataclass
class Seq:
    req: object  # SimRequest
    arrived_ms: float
    uid: int = -1  # in order of admission
    cached: int = 0
    remaining: int = 0
    total: int = 0
    arrived_step: int = 0
    started: bool = False
    last_chunk: int | None = None
    rate: TokenRate = field(default_factory=TokenRate)
    out_left: int = 0
    first_ms: float | None = None
    last_token_ms: float | None = None
    done_ms: float | None = None
    gaps: list = field(default_factory=list)  # (gap ms, beside a prefill)


def _ewma(old: float, new: float) -> float:
    return new if not old else (1 - EWMA) * old + EWMA * new


class PrefixCache:
    """Every stored prompt's prefixes (piece by piece): the longest one a prompt starts with."""

    def __init__(self):
        self.prefixes: set = set()

    def cached(self, pieces) -> int:
        key, tokens, best = (), 0, 0
        for piece in pieces:
            key = hash((key, piece[0]))
            tokens += piece[1]
            if key not in self.prefixes:
                break
            best = tokens
        return min(best, max(0, sum(n for _, n in pieces) - 1))

    def store(self, pieces) -> None:
        key = ()
        for piece in pieces:
            key = hash((key, piece[0]))
            self.prefixes.add(key)


class Loop:
    """The shared part: arrivals, the cache, the decode batch, the clock."""

    def __init__(self, requests: list, costs, max_batch: int, closed: bool):
        self.costs, self.max_batch, self.closed = costs, max_batch, closed
        self.requests = (
            sorted(requests, key=lambda r: (r.step, r.at_ms))
            if closed
            else sorted(requests, key=lambda r: r.at_ms)
        )
        self.next_index = 0
        self.step_start = 0.0  # closed loop: when the current step was released
        self.step_open = -1
        self.t = 0.0
        self.cache = PrefixCache()
        self.queue: list[Seq] = []  # arrived, not admitted
        self.prefilling: list[Seq] = []
        self.decoding: list[Seq] = []
        self.done: list[Seq] = []
        self.steps = 0
        self.admitted = 0

    def _arrival_ms(self, r) -> float:
        return self.step_start + r.at_ms if self.closed else r.at_ms

    def _release(self) -> None:
        """Requests whose time has come join the queue (closed loop: a step at a time)."""
        while self.next_index < len(self.requests):
            r = self.requests[self.next_index]
            if self.closed and r.step != self.step_open:
                busy = self.queue or self.prefilling or self.decoding
                if busy or any(s.req.step == self.step_open for s in self.queue):
                    return
                self.step_open, self.step_start = r.step, self.t
            at = self._arrival_ms(r)
            if at > self.t:
                return
            self.queue.append(Seq(r, at, arrived_step=self.steps))
            self.next_index += 1

    def next_arrival(self) -> float | None:
        if self.next_index >= len(self.requests):
            return None
        r = self.requests[self.next_index]
        if self.closed and r.step != self.step_open:
            return self.t
        return max(self.t, self._arrival_ms(r))

    def admit(self, seq: Seq) -> None:
        seq.cached = self.cache.cached(seq.req.pieces)
        seq.total = seq.remaining = max(0, seq.req.tokens - seq.cached - 1)
        seq.out_left = seq.req.output
        seq.arrived_step = self.steps
        seq.uid = self.admitted
        self.admitted += 1
        self.prefilling.append(seq)

    def prompt_end(self, seq: Seq) -> None:
        self.cache.store(seq.req.pieces)
        self.prefilling.remove(seq)
        self.decoding.append(seq)

    def decode(self, beside: bool) -> None:
        """Every decoding sequence's token at `t`."""
        for seq in list(self.decoding):
            if seq.first_ms is None:
                seq.first_ms = self.t
            else:
                seq.gaps.append((self.t - seq.last_token_ms, beside))
            seq.last_token_ms = self.t
            seq.out_left -= 1
            if seq.out_left <= 0:
                seq.done_ms = self.t
                self.decoding.remove(seq)
                self.done.append(seq)

    def idle(self) -> bool:
        """Nothing to run now: jump to the next arrival; False when everything is done."""
        nxt = self.next_arrival()
        if nxt is None:
            return False
        self.t = max(self.t, nxt)
        return True


def run_ours(requests: list, costs, closed: bool, model: ModelConfig = ModelConfig()) -> Loop:
    """Our policy (module doc), its settings the engine's defaults."""
    loop = Loop(requests, costs, model.max_batch, closed)
    policy = PrefillScheduler(
        "srpt",
        model.prefill_budget,
        model.prefill_group,
        step_factor=model.prefill_step_factor,
        slice_ms=model.prefill_slice_ms,
        overlap=False,
        wait_bound=model.prefill_wait_bound,
        chunk_max=model.prefill_chunk_max,
    )
    fit, idle_ms, rate = ChunkCosts(), 0.0, TokenRate()
    while True:
        loop._release()
        while loop.queue and len(loop.prefilling) + len(loop.decoding) < loop.max_batch:
            loop.admit(loop.queue.pop(0))
        for seq in [s for s in loop.prefilling if s.remaining == 0]:
            loop.prompt_end(seq)
        if not loop.prefilling and not loop.decoding:
            if not loop.idle():
                return loop
            continue
        loop.steps += 1
        decoding = len(loop.decoding)
        step_ms = costs.step_ms(decoding)
        candidates = [
            Candidate(
                uid=s.uid,
                remaining=s.remaining,
                boundary=s.remaining,
                arrived=s.arrived_step,
                cohort=s.uid if s.started else None,
                token_ms=s.rate.token_ms,
                waiting_since=s.last_chunk,
                total=s.total,
            )
            for s in loop.prefilling
        ]
        told = Costs(idle_ms or step_ms, rate.token_ms, step_ms, fit.fixed_ms)
        chunk = policy.next_chunk(candidates, loop.steps, decoding, told)
        chunk_ms = 0.0
        if chunk is not None:
            chunk_ms = costs.chunk_ms(chunk.tokens * len(chunk.uids))
        loop.t += step_ms + chunk_ms
        loop.decode(beside=chunk is not None)
        if chunk is None:
            if decoding:
                idle_ms = _ewma(idle_ms, step_ms)
            continue
        tokens = chunk.tokens * len(chunk.uids)
        fit.observe(tokens, chunk_ms)
        beyond = max(chunk_ms - fit.fixed_ms, chunk_ms * FIXED_SHARE)
        rate.observe(tokens, beyond)
        for s in loop.prefilling:
            if s.uid in chunk.uids:
                s.remaining -= chunk.tokens
                s.started, s.last_chunk = True, loop.steps
                s.rate.observe(tokens, beyond)


def run_fcfs(requests: list, costs, closed: bool, prefill_step: int, max_batch: int) -> Loop:
    """First come, first served, each prompt whole while every stream waits (module doc)."""
    loop = Loop(requests, costs, max_batch, closed)
    while True:
        loop._release()
        if loop.queue and len(loop.decoding) < loop.max_batch:
            seq = loop.queue.pop(0)
            loop.admit(seq)
            left = seq.remaining
            while left > 0:
                n = min(prefill_step, left)
                loop.t += costs.chunk_ms(n)
                left -= n
            seq.remaining = 0
            loop.prompt_end(seq)
            loop.steps += 1
            stalled = True
        else:
            stalled = False
        if loop.decoding:
            loop.steps += 1
            loop.t += costs.step_ms(len(loop.decoding))
            loop.decode(beside=stalled)
        elif not loop.queue and not loop.idle():
            return loop
