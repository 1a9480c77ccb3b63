"""Chunked prefill under the scheduler: the batch generator of `--schedule srpt|fifo`.

mlx-lm's BatchGenerator prefills every admitted sequence together, one padded
batch, a full chunk each per step: a short suffix waits for (and is padded to)
its neighbours' long ones. Here each step
1. decodes every sequence of the generation batch (mlx-lm's own step);
2. moves sequences whose prompt is done (only the last token left) into it;
3. runs the one chunk the PrefillScheduler picks: `tokens` prompt tokens of
   each sequence of one cohort, unpadded.

With `overlap` (`--prefill-overlap on`, the default) step 3 only starts the
chunk: its forward runs on a PrefillWorker thread while the following steps
decode, and the step after it ends lands it (its responses, its costs); one
chunk is in flight at a time, and the next is picked once it has landed. A
chunk that ends no segment and is done by the end of a step's decode lands
there and the next chunk starts at once (its responses go out with the next
step), so the worker does not idle through a decode step between chunks.
With nothing decoding the chunk runs in the step, on the loop thread, as
without overlap: there is no decode to overlap, and a newcomer is admitted
after one chunk (started on the worker, the next chunk would have started
before the newcomer's admission, and it would wait for two); a chunk still
in flight when the decoding ends is waited for. A cohort in
flight is touched by nobody else: it does not move to decode, and reading or
removing one of its sequences waits for the chunk first. A chunk that ends a
segment (a capture point) is landed before the next one starts, so the
generator's snapshot there is taken at that length.

A cohort is a prompt batch of its own (LineagePromptBatch): one sequence, or
several started together because their remaining prefills were similar. It
keeps its merged caches between steps, so a preempted long prompt resumes
where it stopped, and its members leave one by one as their prompts end.
Segments (capture points) are kept: a chunk never crosses a segment end, so
the generator snapshots state there as with mlx-lm's batches. Cancelling
(`remove`) takes a sequence out between steps: at a chunk boundary.

The scheduler ages a waiting sequence by the chunks picked since its last
one, not by the loop's steps: with overlap many decode steps pass during one
chunk (as many as the decode is faster than the chunk, a ratio of this
machine's), and aging per step let two long prompts of similar length take
turns chunk by chunk, so each ended near the end of both.

The chunks' costs are fitted (engine.runtime.batching.chunk_costs) in two
fits: the chunks the worker evaluates module by module (background ones) and
the rest, evaluated whole; their fixed costs differ (a hand-off per module),
and one line through both told neither.

It knows the batches and the clock; the order is the scheduler's.
"""

from __future__ import annotations

import itertools
import time
from collections import deque

import mlx.core as mx
from mlx_lm.generate import PromptProcessingBatch

from engine.runtime.batching.batch import LineageBatchGenerator
from engine.runtime.batching.chunk_costs import ChunkCosts, TokenRate
from engine.runtime.batching.prefill_log import PrefillLog
from engine.runtime.batching.prefill_policy import (
    FIXED_SHARE,
    Candidate,
    Chunk,
    Costs,
    PrefillScheduler,
)
from engine.runtime.batching.prefill_worker import PrefillWorker
from engine.runtime.batching.step_profile import StepProfile

EWMA = 0.3  # weight of the newest measurement in the cost estimates
STEADY_STEPS = 32  # recent steps whose median is a step's steady cost


class Flight:
    """A chunk started on the worker and not landed yet."""

    def __init__(self, cid: int, chunk: Chunk, responses: list, context: int = 0):
        self.cid, self.chunk, self.responses = cid, chunk, responses
        self.context = context  # tokens in its first sequence's cache before it
        self.start = time.perf_counter()
        self.elapsed: float | None = None  # its forward's seconds, once waited for
        self.by_module = False  # the worker evaluates it module by module

    @property
    def tokens(self) -> int:
        """Prompt tokens the chunk prefills (none padded: the same count for each sequence)."""
        return self.chunk.tokens * len(self.chunk.uids)


class Cohort:
    """A prompt batch and its [segments, done, total] rows, in the batch's uid order."""

    def __init__(self, batch, processing: list):
        self.batch = batch
        self.processing = processing
        self.rate = TokenRate()  # its chunks' ms per token beyond the fixed cost, lately

    def index(self, uid: int) -> int:
        return self.batch.uids.index(uid)

    def keep(self, indices: list[int]) -> None:
        self.batch.filter(indices)
        self.processing = [self.processing[i] for i in indices]


def _ewma(old: float, new: float) -> float:
    return new if old <= 0 else (1 - EWMA) * old + EWMA * new


def _median(values) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0


def _remaining(segments: list) -> int:
    """Prompt tokens left to prefill: all but the last segment (the last token alone)."""
    return sum(len(s) for s in segments[:-1])


class ChunkedBatchGenerator(LineageBatchGenerator):
    """LineageBatchGenerator whose prefill runs chunk by chunk as the scheduler says."""

    def __init__(
        self,
        model,
        *,
        scheduler: PrefillScheduler,
        profile: StepProfile | None = None,
        module_eval: bool = False,
        log: PrefillLog | None = None,
        **kwargs,
    ):
        super().__init__(model, **kwargs)
        self.scheduler = scheduler
        # Chunks run on the worker when the scheduler sizes them for it (`overlap`);
        # `module_eval`: it evaluates module by module (engine.runtime.batching.prefill_worker).
        self.worker = PrefillWorker(model, module_eval) if scheduler.overlap else None
        self.flight: Flight | None = None  # the chunk on the worker
        self.landed: Flight | None = None  # the chunk landed whose responses go out next
        self.profile = profile or StepProfile()
        self.log = log or PrefillLog()  # each chunk, each prefilling sequence's track
        self.cohorts: dict[int, Cohort] = {}
        self._cohort_ids = itertools.count()
        self.steps = 0
        # The scheduler's clock: chunks picked (module doc), not steps.
        self.arrived: dict[int, int] = {}  # uid -> chunks picked before it arrived
        self.last_chunk: dict[int, int] = {}  # uid -> chunks picked when its latest landed
        self.unblocks: dict[int, int] = {}  # uid -> its prompt tokens up to an awaited anchor
        # Recent steady steps (the profile's wall time less one-off admissions, captures and
        # commits): decode-only ones (a stream's idle gap), and those with a chunk beside
        # decode, less the chunk's forward. Medians: a spike must not size the chunks.
        self._idle_steps: deque = deque(maxlen=STEADY_STEPS)
        self._beside_steps: deque = deque(maxlen=STEADY_STEPS)
        self._decode_part_ms = 0.0  # the decode part of any step
        self._rate = TokenRate()  # prefill time per token beyond a chunk's fixed cost
        self.chunk_costs = ChunkCosts()  # a chunk's fixed cost and cost per token, fitted
        # The same for the chunks the worker evaluates module by module (background ones):
        # their fixed cost is another (a hand-off per module), so it is fitted apart.
        self.module_costs = ChunkCosts()
        self._learned: object = None  # the last profile record learned from
        self.chunks: list[Chunk] = []  # the chunks run, newest last (bounded)

    def insert_segments(self, segments, *args, **kwargs):
        uids = super().insert_segments(segments, *args, **kwargs)
        for uid in uids:
            self.arrived[uid] = self.scheduler.picked
        return uids

    # ---- the step ----------------------------------------------------------------

    def _next(self):
        self.steps += 1
        self._learn()
        generation_responses = []
        held = set()  # cohorts whose landed chunk's responses go out this step
        if self.landed is not None:  # landed after the last step's decode, or between steps
            held.add(self.landed.cid)
        prompt_responses = self._delivered()
        if self.flight is not None and (self.worker.done or not len(self._generation_batch)):
            self._settle()
        if self.landed is not None:
            held.add(self.landed.cid)
        prompt_responses += self._delivered()
        tic = time.perf_counter()
        if len(self._generation_batch) > 0:
            with self.profile.phase("decode"):
                generation_responses = self._generation_batch.next()
            elapsed = time.perf_counter() - tic
            self._counters.decode_time += elapsed
            self._counters.generation_tokens += len(generation_responses)
            self._counters.generation_steps += 1
            self._decode_part_ms = _ewma(self._decode_part_ms, elapsed * 1000)
            if self._counters.generation_steps % 512 == 0:
                mx.clear_cache()
        self._start_decoding(prompt_responses, held)
        captures = any(r.end_of_segment and not r.end_of_prompt for r in prompt_responses)
        decoding = len(self._generation_batch)
        if captures:  # a snapshot due first
            return prompt_responses, generation_responses
        if self.flight is not None:  # one in flight: the next starts once it lands
            if not (decoding and self.worker.done) or self._ends_segment(self.flight):
                return prompt_responses, generation_responses
            # Landed during the decode step: the worker gets its next chunk now, not one
            # step later (the landed chunk's responses go out with the next step).
            self._settle()
        # The policy's clock is the chunks picked, not the loop's steps (module doc).
        picked = self.scheduler.picked
        chunk = self.scheduler.next_chunk(self._candidates(), picked, decoding, self._costs())
        if chunk is not None:
            prompt_responses += self._prefill(chunk)
        return prompt_responses, generation_responses

    def _learn(self) -> None:
        """The last whole step's wall time (the profile's: emits and commits included): a
        decode-only step is a stream's idle gap; a step with a chunk beside decode tells
        what such a step spends besides the chunk's forward."""
        last = self.profile.last
        if last is None or last is self._learned:
            return
        self._learned = last
        if not last.decoded:  # no stream waited through it
            return
        ms = last.phases
        steady = last.total_ms - ms["admit"] - ms["capture"] - ms["commit"]
        if last.prefill_tokens:
            self._beside_steps.append(steady - ms["prefill"])
        else:
            self._idle_steps.append(steady)

    def _costs(self) -> Costs:
        """The measured costs: a decode-only step (else the decode part of a step), a token,
        a step's work besides its chunk (else the decode-only step)."""
        decode = _median(self._idle_steps) or self._decode_part_ms
        beside = _median(self._beside_steps) or decode
        by_module = self.worker is not None and self.worker.module_eval
        background = self.module_costs.fixed_ms if by_module else None
        return Costs(decode, self._rate.token_ms, beside, self.chunk_costs.fixed_ms, background)

    def _room(self) -> int:
        started = len(self._generation_batch) + sum(len(c.batch) for c in self.cohorts.values())
        return self.completion_batch_size - started

    def _candidates(self) -> list[Candidate]:
        out = []
        for cid, cohort in self.cohorts.items():
            for uid, (segments, done, total) in zip(cohort.batch.uids, cohort.processing):
                out.append(self._candidate(uid, segments, done, cid, total - 1))
        if self._room() > 0:
            for seq in self._unprocessed_sequences:
                out.append(self._candidate(seq[0], seq[1], 0, None))
        return out

    def _candidate(self, uid: int, segments: list, done: int, cohort, total=None) -> Candidate:
        anchor = self.unblocks.get(uid)
        return Candidate(
            uid=uid,
            remaining=_remaining(segments),
            boundary=len(segments[0]),
            arrived=self.arrived.get(uid, 0),
            cohort=cohort,
            unblocks=None if anchor is None else max(0, anchor - done),
            token_ms=0.0 if cohort is None else self.cohorts[cohort].rate.token_ms,
            waiting_since=self.last_chunk.get(uid),
            total=total,
        )

    def _start_cohort(self, uids) -> int:
        """Take `uids` off the queue into a new cohort (their restored caches merge here)."""
        wanted = set(uids)
        taken = [s for s in self._unprocessed_sequences if s[0] in wanted]
        for seq in taken:
            self._unprocessed_sequences.remove(seq)
        cid = next(self._cohort_ids)
        self.cohorts[cid] = Cohort(*self._prompt_batch_of(taken))
        return cid

    def _start_decoding(self, responses: list, held: set = frozenset()) -> None:
        """Sequences with only their last token left enter the generation batch; not those of
        the cohorts `held`, whose chunk's responses go out this step (as a chunk run in this
        step, they may be read at their capture point first)."""
        ready = [s[0] for s in self._unprocessed_sequences if len(s[1]) == 1]
        if ready and self._room() > 0:
            self._start_cohort(ready[: self._room()])
        for cid, cohort in list(self.cohorts.items()):
            if cid in held or (self.flight is not None and cid == self.flight.cid):
                continue  # its rows are ahead of its caches until it lands
            split = [i for i, row in enumerate(cohort.processing) if len(row[0]) == 1]
            if not split:
                continue
            rows = [cohort.processing[i] for i in split]
            rest = [i for i in range(len(cohort.processing)) if i not in set(split)]
            cohort.processing = [cohort.processing[i] for i in rest]
            gen = cohort.batch.split(split).generate([row[0][0] for row in rows])
            for uid, row in zip(gen.uids, rows):
                self._forget(uid)
                responses.append(PromptProcessingBatch.Response(uid, (row[2],) * 2, True, True))
            self._generation_batch.extend(gen)
            if not cohort.processing:
                del self.cohorts[cid]

    def _prefill(self, chunk: Chunk) -> list:
        cid = self._cohort_id(chunk.uids[0])
        if cid is None:
            cid = self._start_cohort(chunk.uids[: max(1, self._room())])
        cohort = self.cohorts[cid]
        prompts, responses = [], []
        context = cohort.processing[0][1]
        for uid, row in zip(cohort.batch.uids, cohort.processing):
            segments = row[0]
            n = min(chunk.tokens, len(segments[0]))
            prompts.append(segments[0][:n])
            segments[0] = segments[0][n:]
            end = not segments[0]
            if end:
                segments.pop(0)
            row[1] += n
            responses.append(PromptProcessingBatch.Response(uid, (row[1], row[2]), end, False))
        assert len({len(p) for p in prompts}) == 1, "a chunk is never padded"
        ran = Chunk(tuple(cohort.batch.uids), len(prompts[0]), chunk.whole, chunk.background)
        flight = Flight(cid, ran, responses, context)
        if self.worker is not None and len(self._generation_batch):  # beside the decodes
            # A stream is its thread's: what this thread left lazy (a merge, a filter) is
            # evaluated here, or the worker could not run it.
            mx.eval([c.state for c in cohort.batch.prompt_cache])
            # A chunk longer than the streams' gap budget leaves the MLX queue to the decodes
            # as it goes (prefill_worker); one within it, or a short prefill run whole (a
            # first token waited for), runs its forward whole: the streams wait at most it.
            self.worker.start(cohort.batch, prompts, by_module=chunk.background)
            flight.by_module = self.worker.module_eval and chunk.background
            self.flight = flight
            return []
        tic = time.perf_counter()
        with self.profile.phase("prefill"):
            cohort.batch.forward(prompts)
        flight.elapsed = time.perf_counter() - tic
        return self._account(flight)

    @staticmethod
    def _ends_segment(flight: Flight) -> bool:
        """Its chunk ends a segment (a capture point, a prompt end): it lands in a step of
        its own, so the generator reads the state there before the cohort moves on."""
        return any(r.end_of_segment for r in flight.responses)

    def _settle(self) -> None:
        """Land the chunk in flight: wait for it, account for it; its responses go out with
        the next step (its cohort may be read or changed after)."""
        if self.flight is None:
            return
        flight, self.flight = self.flight, None
        with self.profile.phase("prefill"):
            flight.elapsed = self.worker.wait()
        self.landed = flight
        self._account(flight)

    def _delivered(self) -> list:
        """The landed chunk's responses, of the sequences still in its cohort."""
        flight, self.landed = self.landed, None
        cohort = None if flight is None else self.cohorts.get(flight.cid)
        if cohort is None:  # none landed, or every sequence of it was removed since
            return []
        return [r for r in flight.responses if r.uid in cohort.batch.uids]

    def _account(self, flight: Flight) -> list:
        """A chunk's costs and counters, on the loop thread; its responses."""
        self.chunks = self.chunks[-255:] + [flight.chunk]
        cohort = self.cohorts[flight.cid]  # landed before any removal from it
        cohort.batch.account()
        elapsed, tokens = flight.elapsed, flight.tokens
        self.profile.prefill_tokens += tokens
        self._counters.prompt_tokens += tokens
        self._counters.prompt_time += elapsed
        chunk = flight.chunk
        log = (chunk.uids, flight.start, elapsed, chunk.tokens, flight.context, flight.by_module)
        self.log.chunk(*log)
        ms = elapsed * 1000
        fit = self.module_costs if flight.by_module else self.chunk_costs
        fit.observe(tokens, ms)
        # The cost per token beyond the fixed cost (the fit's, at this cohort's context).
        beyond = max(ms - fit.fixed_ms, ms * FIXED_SHARE)
        self._rate.observe(tokens, beyond)
        cohort.rate.observe(tokens, beyond)
        for uid in cohort.batch.uids:
            self.last_chunk[uid] = self.scheduler.picked
        return flight.responses

    def close(self) -> None:
        """End the prefill worker (after the chunk in flight), then what mlx-lm's close ends."""
        if self.worker is not None:
            self.worker.close()
        super().close()

    def __del__(self):
        # mlx-lm's __del__ calls close(), and the collector runs it on whichever thread
        # allocates: one starting a thread holds threading's shutdown lock there, which
        # the worker's thread needs to end, so a join deadlocks both. Never wait here, and
        # submit nothing: this may run inside another executor's submit, under its lock.
        if getattr(self, "worker", None) is not None:
            self.worker.close(wait=False, release=False)
        LineageBatchGenerator.close(self)

    def _forget(self, uid: int) -> None:
        for table in (self.arrived, self.unblocks, self.last_chunk):
            table.pop(uid, None)

    def prefill_track(self, uid: int):
        """`uid`'s prefill track (engine.runtime.batching.prefill_log), taken out of the log."""
        return self.log.take(uid)

    # ---- the engine's view of a sequence in prefill -------------------------------

    def _cohort_id(self, uid: int) -> int | None:
        return next((k for k, c in self.cohorts.items() if uid in c.batch.uids), None)

    def _cohort_of(self, uid: int) -> Cohort | None:
        """`uid`'s cohort, its chunk in flight waited for."""
        cid = self._cohort_id(uid)
        if cid is not None and self.flight is not None and cid == self.flight.cid:
            self._settle()
        return None if cid is None else self.cohorts[cid]

    def prefill_state(self, uid: int):
        from engine.runtime.layer_caches import snapshot_state

        cohort = self._cohort_of(uid)
        return snapshot_state(cohort.batch.prompt_cache, cohort.index(uid))

    def prefill_extract(self, uid: int) -> list:
        cohort = self._cohort_of(uid)
        return cohort.batch.extract_cache(cohort.index(uid))

    def extract_cache(self, uids):
        results = super().extract_cache([u for u in uids if self._cohort_of(u) is None])
        for uid in uids:
            cohort = self._cohort_of(uid)
            if cohort is not None:
                i = cohort.index(uid)
                results[uid] = (cohort.batch.extract_cache(i), cohort.batch.tokens[i])
        return results

    def remove(self, uids, return_prompt_caches=False):
        """Take sequences out between steps (so a prefill stops at a chunk boundary)."""
        for uid in uids:  # a chunk of theirs in flight lands first: what it brings goes too
            if self._cohort_id(uid) is not None:
                self._cohort_of(uid)
        caches = self.extract_cache(uids) if return_prompt_caches else {}
        self.forget_rows(uids)
        rest = []
        for uid in uids:
            self._forget(uid)
            self.log.take(uid)
            cid = self._cohort_id(uid)
            if cid is None:
                rest.append(uid)
                continue
            self._cohort_of(uid)  # its chunk in flight ends first
            cohort = self.cohorts[cid]
            i = cohort.index(uid)
            cohort.keep([j for j in range(len(cohort.batch.uids)) if j != i])
            if not cohort.batch.uids:
                del self.cohorts[cid]
        super().remove(rest)
        return caches
