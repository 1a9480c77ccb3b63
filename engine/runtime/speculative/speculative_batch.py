"""The lineage generation batch with speculative decoding: drafts verified in one forward.

Each step, every decoding sequence may bring drafts (engine.runtime.speculative.drafts):
1. Drafts: each row whose draft length wants some (engine.runtime.speculative.draft_length)
   asks its source. A row's source is first asked on the context it has fed
   (no wait for the token being sampled); only when some row has a guess does
   the step wait for the sampled tokens and ask again with them. With no
   guess anywhere the step is mlx-lm's own, pipelined as before.
2. Verify: one forward of the whole batch, each row its current token and its
   drafts (padded to the batch's longest: padding is never accepted).
3. Accept: greedy exact match or speculative sampling, per row
   (engine.runtime.speculative.verification), then cut at a stop token or max_tokens, so
   a row never keeps a token it would not have emitted.
4. Roll back: every layer cache to the kept tokens of each row
   (engine.runtime.speculative.rollback: trim the KV, restore and replay the state).
5. Emit: one Response per kept token, in order; the last carries the finish.

With an MTP head (`Speculation.mtp`, engine.runtime.speculative.mtp_drafts) the drafts are
the head's, drawn at the end of the step before (with a source beside it, a
row's lookup guess goes first): every step is then a verify forward of the
model's trunk (its final hidden states feed the head), rows without drafts
feeding one token.

A row's tokens thus leave several per step; `tokens[r]` is always exactly
what its caches hold, so a finished row's extraction (and the lineage
cache's commit after it) holds accepted tokens only.

A grammar-constrained row drafts too (engine.runtime.speculative.constrained_drafts):
its drafts are cut to what its matcher allows, its verify positions are
masked by the matcher's state after the tokens before each, and its matcher
is rolled back to the kept tokens with the caches. A step where no row drafts
is the masked plain step of engine.runtime.structured.masked_batch, whose batch this one
extends.

It knows the batch's rows and mlx-lm's step; what to draft is the sources'.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx

from engine.runtime.speculative import constrained_drafts, rollback, verification
from engine.runtime.speculative.draft_length import DraftLength, StepCosts, batch_k
from engine.runtime.speculative.drafts import DraftSource
from engine.runtime.speculative.mtp import lm_logits
from engine.runtime.speculative.mtp_drafts import MTPDrafts
from engine.runtime.speculative.state_replay import MixerTaps
from engine.runtime.structured.masked_batch import LineageGenerationBatch


@dataclass(frozen=True)
class Speculation:
    """How the generation batch speculates: its draft source and draft length."""

    source: DraftSource | None  # None: the MTP head drafts alone
    num_draft_tokens: int | None = None  # `--num-draft-tokens`: K, or None for auto
    # A rollback replays the recurrent mixers alone where it can (else the whole model).
    mixer_replay: bool = True
    # the model's MTP head (engine.runtime.speculative.mtp): its drafts, `mtp_chain` a step
    mtp: object = None

    @property
    def mtp_chain(self) -> int:
        """The drafts the MTP head chains a step: `--num-draft-tokens K`, 1 under auto."""
        return self.num_draft_tokens or 1


@dataclass
class DraftCounts:
    """What one sequence's drafts did (the bench and the final event read them)."""

    verifies: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class SpeculationStats:
    """The batch's totals: verify steps, positions replayed by rollbacks."""

    verify_steps: int = 0
    plain_steps: int = 0
    replayed: int = 0  # positions the rollbacks replayed
    replays: int = 0  # rollbacks that replayed
    verify_ms: float = 0.0  # the verify forwards' time (to their tokens on the host)
    replay_ms: float = 0.0  # the rollbacks' time
    plain_ms: float = 0.0  # the plain steps' time
    head_ms: float = 0.0  # the MTP head's forwards (its drafts for the next step)
    grammar_cut: int = 0  # drafts cut because a row's grammar refused them
    # constrained rows' matcher work: drafts cut, and in verify steps masks and rollbacks
    matcher_ms: float = 0.0
    # Rows that drafted and accepted every draft, some, none (the tests read them)
    accepted_all: int = 0
    accepted_some: int = 0
    accepted_none: int = 0
    counts: dict = field(default_factory=dict)  # uid -> DraftCounts


class SpeculativeGenerationBatch(LineageGenerationBatch):
    """A generation batch whose step verifies drafts (module doc)."""

    speculation: Speculation
    stats: SpeculationStats
    lengths: dict

    @classmethod
    def speculating(cls, model, fallback_sampler, speculation: Speculation):
        batch = cls.empty(model, fallback_sampler)
        batch.speculation = speculation
        batch.stats = SpeculationStats()
        batch.lengths = {}  # uid -> DraftLength
        batch.costs = StepCosts()  # a forward's ms by the tokens it feeds (auto's K)
        # The recurrent mixers, tapped so a rollback replays them alone (None: the model's
        # state layers need the whole model replayed; engine.runtime.speculative.state_replay).
        batch.taps = MixerTaps.of(model) if speculation.mixer_replay else None
        head = speculation.mtp
        batch.mtp = None if head is None else MTPDrafts(model, head, speculation.mtp_chain)
        # the prompt batches keep their prompts' last hidden states here for the head
        batch.tails = None if batch.mtp is None else batch.mtp.tails
        return batch

    def extend(self, batch):
        if self.mtp is not None:
            self.mtp.extend(list(batch.uids), batch.tokens)
        super().extend(batch)

    def filter(self, keep):
        kept = {self.uids[i] for i in keep}
        source = self.speculation.source
        for uid in self.uids:
            if uid not in kept:
                if source is not None:
                    source.forget(uid)
                self.lengths.pop(uid, None)
        if self.mtp is not None:
            self.mtp.filter(list(keep))
        super().filter(keep)

    def next(self):
        if not self.uids:
            return []
        drafts = self._drafts()
        if drafts is None and self.mtp is not None:
            # The head reads every step's hidden states: no row drafts, one token each.
            drafts = self._next_tokens.tolist(), [[] for _ in self.uids]
        if drafts is None:
            self.stats.plain_steps += 1
            for uid in self.uids:
                self._length(uid).decoded(1)
            tic = time.perf_counter()
            out = super().next()
            ms = (time.perf_counter() - tic) * 1000
            self.costs.record(len(out), ms)
            self.stats.plain_ms += ms
            return out
        return self._verify(*drafts)

    # ---- 1) drafts ----------------------------------------------------------

    def _length(self, uid: int) -> DraftLength:
        length = self.lengths.get(uid)
        if length is None:
            length = self.lengths[uid] = DraftLength(self.speculation.num_draft_tokens)
        return length

    def _drafts(self):
        """(current tokens, drafts per row), or None when no row drafts this step."""
        source = self.speculation.source
        lengths = [self._length(uid) for uid in self.uids]
        wanted = [length.wanted() for length in lengths]
        if self.speculation.num_draft_tokens is None and any(wanted):  # auto: K for speed
            rates = [length.rate if k else None for length, k in zip(lengths, wanted)]
            k = batch_k(rates, self.costs, rollback.replays(self.prompt_cache))
            wanted = [min(w, k) for w in wanted]
        if self.mtp is not None:
            return self._head_drafts(wanted)
        # Guesses from what each row has fed: one more token, to cover the one in flight.
        early = [
            source.propose(uid, self.tokens[r], k + 1) if k else []
            for r, (uid, k) in enumerate(zip(self.uids, wanted))
        ]
        if not any(early):
            return None
        current = self._next_tokens.tolist()
        drafts = []
        for r, (uid, k) in enumerate(zip(self.uids, wanted)):
            if not early[r]:
                drafts.append([])
                continue
            guess = early[r][1:] if early[r][0] == current[r] else None
            if guess is None:
                guess = source.propose(uid, self.tokens[r] + [current[r]], k)
            guess = self._held(r, current[r], guess[:k])
            if not guess:  # its guess missed the token in flight: a failed draft, waited for
                lengths[r].verified(1, 0)
            drafts.append(guess[:k])
        if not any(drafts):
            return None
        return current, drafts

    def _head_drafts(self, wanted: list[int]):
        """(current tokens, drafts per row) with an MTP head: a row's lookup guess where its
        source has one (auto), else the head's; None if no row has a guess."""
        guesses = self.mtp.proposals(wanted)
        current = self._next_tokens.tolist()
        source = self.speculation.source
        if source is not None:
            for r, (uid, k) in enumerate(zip(self.uids, wanted)):
                found = source.propose(uid, self.tokens[r] + [current[r]], k) if k else []
                if found:
                    guesses[r] = found
        guesses = [self._held(r, current[r], g) for r, g in enumerate(guesses)]
        if not any(guesses):
            return None
        return current, guesses

    def _held(self, r: int, current: int, guess: list[int]) -> list[int]:
        """Row r's guess cut to what its grammar allows after `current` (all, unconstrained)."""
        matcher = self.matchers.get(self.uids[r]) if guess else None
        if matcher is None:
            return guess
        tic = time.perf_counter()
        held = constrained_drafts.allowed(matcher, current, guess)
        self.stats.matcher_ms += (time.perf_counter() - tic) * 1000
        self.stats.grammar_cut += len(guess) - held
        return guess[:held]

    # ---- 2) to 5) verify, accept, roll back, emit -----------------------------

    def _verify(self, current: list[int], drafts: list[list[int]]):
        self.stats.verify_steps += 1
        fed = 1 + max(len(d) for d in drafts)
        inputs = [[t] + d + [0] * (fed - 1 - len(d)) for t, d in zip(current, drafts)]
        snapshot = rollback.take(self.prompt_cache, self.taps)

        # 2) Verify: the whole batch in one forward.
        tic = time.perf_counter()
        if self.mtp is not None:  # the trunk's hidden states feed the head after the step
            hidden = self.model.model(mx.array(inputs), cache=self.prompt_cache)
            logits = lm_logits(self.model, hidden)
        else:
            logits = self.model(mx.array(inputs), cache=self.prompt_cache)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        # Constrained rows: their positions masked by their grammars (drafts cut in place).
        logprobs, walk = constrained_drafts.walk(
            logits, logprobs, self.matcher_rows(), current, drafts
        )
        # A request's own sampler (engine.runtime.sampling) samples; any other row takes
        # the batch's argmax (mlx-lm's default sampler, the engine's greedy).
        samplers = [s if hasattr(s, "logits") else None for s in self.samplers or self.uids]
        greedy_rows = [r for r, s in enumerate(samplers) if s is None]
        if greedy_rows:
            targets = mx.argmax(logprobs, axis=-1).tolist()
        else:
            mx.eval(logprobs)
            targets = None
        ms = (time.perf_counter() - tic) * 1000
        self.costs.record(len(inputs) * fed, ms)
        self.stats.verify_ms += ms

        # 3) Accept, then cut at a stop token or max_tokens.
        kept, nexts, finish = [], [], []
        for r, (uid, d) in enumerate(zip(self.uids, drafts)):
            if samplers[r] is None:
                verdict = verification.greedy(targets[r], d)
            else:
                verdict = verification.sample(samplers[r], logprobs[r], d)
            emitted = [current[r]] + d[: verdict.accepted]
            n, reason = self._cut(r, emitted)
            kept.append(n)
            nexts.append(verdict.next_token)
            finish.append(reason)
            self._count(uid, len(d), verdict.accepted, n)
        if walk is not None:  # each matcher to its row's kept tokens
            self.stats.matcher_ms += walk.settle(kept)

        # 4) Roll back each row to its kept tokens.
        tic = time.perf_counter()
        replayed = rollback.roll_back(self.model, self.prompt_cache, snapshot, inputs, kept)
        self.stats.replay_ms += (time.perf_counter() - tic) * 1000
        self.stats.replayed += replayed
        self.stats.replays += 1 if replayed else 0
        if self.mtp is not None:
            tic = time.perf_counter()
            self.mtp.advance(hidden, inputs, kept, nexts)
            self.stats.head_ms += (time.perf_counter() - tic) * 1000

        # 5) Emit: one response per kept token; the next step starts from the drawn ones.
        previous = self._next_logprobs
        self._next_tokens = mx.array(nexts, dtype=mx.uint32)
        self._next_logprobs = [logprobs[r, kept[r] - 1] for r in range(len(self.uids))]
        responses, keep = [], []
        for r, uid in enumerate(self.uids):
            tokens = inputs[r][: kept[r]]
            self.tokens[r].extend(tokens)
            for i, token in enumerate(tokens):
                last = i == len(tokens) - 1
                reason = finish[r] if last else None
                responses.append(
                    self.Response(
                        uid=uid,
                        token=token,
                        logprobs=previous[r] if i == 0 else logprobs[r, i - 1],
                        finish_reason=reason,
                        prompt_cache=self.extract_cache(r) if reason else None,
                        all_tokens=self.tokens[r] if reason else None,
                    )
                )
            if finish[r] is None:
                keep.append(r)
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses

    def _cut(self, r: int, emitted: list[int]) -> tuple[int, str | None]:
        """How many of `emitted` row r keeps, and its finish reason (mlx-lm's checks, per
        token: max_tokens, then its stop sequences)."""
        for i, token in enumerate(emitted):
            self._num_tokens[r] += 1
            reason = "length" if self._num_tokens[r] >= self.max_tokens[r] else None
            if self._matchers[r].advance(token):
                reason = "stop"
            if reason is not None:
                return i + 1, reason
        return len(emitted), None

    def _count(self, uid: int, drafted: int, accepted: int, kept: int) -> None:
        if drafted:
            stats = self.stats
            if accepted == drafted:
                stats.accepted_all += 1
            elif accepted:
                stats.accepted_some += 1
            else:
                stats.accepted_none += 1
        counts = self.stats.counts.setdefault(uid, DraftCounts())
        counts.verifies += 1 if drafted else 0
        counts.drafted += drafted
        counts.accepted += min(accepted, kept - 1)
        length = self._length(uid)
        length.verified(drafted, accepted)
        length.decoded(kept)
