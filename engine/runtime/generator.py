"""Continuous batching with restores and capture points, over mlx-lm's BatchGenerator.

The generator knows tensors and the batch; it knows nothing about which entry
to restore or what to keep: a request arrives with its RestorePlan, and a
finished request leaves as a Commit for the cache manager, whose Orders come
back through the order ledger. Every method runs on one thread (the model
actor's loop); nothing here locks.

It is the step loop that composes its parts:
- `Admission` (engine.runtime.admission): what waits, what fits, and why;
- `Restorer` and `Commits` (engine.runtime.tier): a plan's restore point read at
  admission, and what a request leaves, staged and committed;
- `OrderLedger` (engine.runtime.ordering): every call to the cache manager
  goes through it, which counts the calls until answered and numbers the
  Orders applied, so a plan restores only after the Orders it follows;
- `ActiveRequest` (engine.runtime.active): one request in the batch, from
  admission to its Finished event (engine.runtime.output).

It emits token ids only. Detokenizing and stop strings are the front end's
(engine.server.front.text), which handles a whole step's tokens at once: the loop
only computes, samples and stops at a stop token, max_tokens, or when the
front end says a stop string ended the text (`cancel(..., reason=STOP)`).

Capture points: the prompt is split into segments at each capture point, so
prefill stops exactly there (BatchGenerator's segments) and the state layers
of that sequence are snapshotted before the next chunk runs. The state at the
prompt end is taken when the sequence enters the generation batch (its last
prompt token has just been fed).

Staging: what a request leaves (its entries, an anchor captured mid-prefill)
waits aside in the RAM tier until the Orders answering its commit come back
(`Commits`, engine.runtime.tier.commits); a plan that loads a file first asks
for the Orders that make room for it (Admission, `CacheLink.room`). So the tier
holds no entry before the frees that make its room.

A restore point that turns out gone at admission is reported
(`CacheLink.replan`, a LostRestore); the request waits for its new plan, and
its final event names the lost point (`Finished.restore_lost`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from mlx_lm.generate import StopSequences

from engine.cache.kinds import CaptureKind
from engine.cache.messages import Orders
from engine.config import EngineConfig
from engine.runtime.active import ActiveRequest
from engine.runtime.admission import Admission
from engine.runtime.batching.batch import bound_pool
from engine.runtime.batching.chunked import ChunkedBatchGenerator
from engine.runtime.batching.for_schedule import new_batch_generator
from engine.runtime.batching.layer_timer import LayerTimer
from engine.runtime.batching.prefill_log import PrefillLog
from engine.runtime.batching.step_profile import StepProfile
from engine.runtime.branches import Branch, branch_active, branch_key, branch_request
from engine.runtime.events import Emit, Finished, FinishReason, Progress
from engine.runtime.logprobs import tokens_event
from engine.runtime.ordering import CacheLink, OrderLedger
from engine.runtime.output import Stamps, unstarted_event
from engine.runtime.requests import GenerationRequest
from engine.runtime.sampling import greedy, make_sampler
from engine.runtime.structured.masked_batch import sample_first
from engine.runtime.structured.matcher import Grammars
from engine.runtime.tier.commits import Commits
from engine.runtime.tier.ram import RamTier
from engine.runtime.tier.restore import Restorer

log = logging.getLogger(__name__)

PROGRESS_MIN_TOKENS = 256  # stream prefill progress only for prompts at least this long,
# and at most once per this many tokens: a chunk beside decode can be 4 tokens, and an
# event per chunk costs a decoding stream's step more than the chunk does


class Generator:
    """The batch loop of one model replica."""

    def __init__(
        self,
        model,
        tokenizer,
        config: EngineConfig,
        tier: RamTier,
        cache: CacheLink,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.tier = tier
        self.order_ledger = OrderLedger(cache)  # every cache manager call goes through it
        args = getattr(model, "args", None)  # a multimodal model's text config holds it
        vocab = getattr(args, "vocab_size", None) or (getattr(args, "text_config", None) or {}).get(
            "vocab_size"
        )
        self.vocab_size = int(vocab) if vocab else len(tokenizer)
        self.eos_ids = frozenset(int(t) for t in tokenizer.eos_token_ids)
        self.pool_limit = bound_pool(config.cache.ram_budget, config.cache.pool_limit)
        self.profile = StepProfile()  # where each step's wall time goes
        self.prefill_log = PrefillLog()  # each prefill's chunks, each request's row
        self.bg = new_batch_generator(self.model, self.config, self.profile, self.prefill_log)
        self.active: dict[int, ActiveRequest] = {}  # uid -> request
        self.by_request: dict[str, int] = {}  # request_id -> uid
        self.admission = Admission(
            tier, self.order_ledger, self.active, config.model.max_batch_tokens, lambda: self.wake()
        )
        self.restorer = Restorer(tier, self.order_ledger, self.admission.put_first)
        self.commits = Commits(config.cache, tier, self.order_ledger)
        self.wake: Callable[[], None] = lambda: None  # the loop sets it: a read has ended
        self.timer = LayerTimer(
            model, config.cache.layer_timer_flag, config.cache.layer_timer_requests
        )
        # Compiled grammars by key; each constrained request gets its own matcher.
        self.grammars = Grammars(
            tokenizer, self.vocab_size, self.eos_ids, config.model.grammar_cache
        )

    def close(self) -> None:
        """Close the batch generator (its prefill worker, mlx-lm's wired limit): once the
        loop stops, and before it is replaced."""
        self.bg.close()

    # ---- requests in ----------------------------------------------------

    @property
    def pending(self) -> list[tuple[GenerationRequest, Emit]]:
        """The requests not in the batch yet, in order (Admission.waits says why each waits)."""
        return self.admission.pending

    def submit(self, req: GenerationRequest, emit: Emit) -> None:
        self.admission.submit(req, self.profile.timed("emit", emit))

    def cancel(
        self,
        request_id: str,
        on_done: Callable[[], None] | None = None,
        reason: FinishReason = FinishReason.CANCELLED,
    ) -> None:
        """Stop a request now: its slot is freed before the next decode step.

        `on_done` runs once what the request leaves behind is committed (or
        released): a retry planned after it sees that entry. `reason` STOP: the
        front end found a stop string in its text; it ends as if at a stop token.
        """
        done = on_done or (lambda: None)
        # Waiting for its new plan (then that one is released), or pending.
        withdrawn = self.restorer.withdraw(request_id) or self.admission.withdraw(request_id)
        if withdrawn is not None:
            req, emit = withdrawn
            self._release(req)
            emit(self._unstarted(req, FinishReason.CANCELLED))
            return done()
        self._cancel_branches(request_id, reason)
        uid = self.by_request.get(request_id)
        if uid is None:
            return done()
        act = self.active[uid]
        emit = act.emit
        act.emit = lambda event: (emit(event), isinstance(event, Finished) and done())
        cache, tokens = self.bg.remove([uid], return_prompt_caches=True)[uid]
        if len(tokens) <= act.restore_length:  # not admitted to the batch yet: nothing new
            self._forget(uid)
            self._release(act.req)
            act.emit(self._final_event(act, FinishReason.CANCELLED))
            return
        # In prefill, the prefix prefilled so far (and its captures) is still worth
        # keeping: a retry of a dropped long prompt resumes there.
        self._complete(act, reason, cache, list(tokens))

    def _cancel_branches(self, request_id: str, reason: FinishReason) -> None:
        """A request's other branches end with it: forked ones leave the batch; ones not forked
        yet (its prompt still in prefill) were never in it."""
        uid = self.by_request.get(request_id)
        for branch in self.bg.forks.pop(uid, ()) if uid is not None else ():
            act = self.active.get(branch.uid)
            self._forget(branch.uid)
            if act is not None:
                act.emit(self._final_event(act, FinishReason.CANCELLED))
        for key in [k for k in self.by_request if k.startswith(request_id + "#")]:
            self.cancel(key, reason=reason)

    def want_prompt_end(self, request_id: str, entry_id: int, told: Callable[[str], None]):
        """Another request waits for `request_id`'s prompt end (RestorePlan.after_entry): it
        is stored under `entry_id` once that request has it, at once if it decodes already;
        `told(outcome)` then (Commits.want_prompt_end). "unknown" at once when no such
        request is here (not submitted yet, or over): the waiter asks the manager again."""
        uid = self.by_request.get(request_id)
        queued = any(req.request_id == request_id for req, _ in self.pending)
        if uid is None and not (queued or request_id in self.restorer.replanning):
            return told("unknown")
        self.commits.want_prompt_end(request_id, entry_id, told)
        act = self.active.get(uid) if uid is not None else None
        if act is not None and act.prompt_end_state is not None:
            self.commits.prompt_end(act, request_id, lambda: self.bg.generation_extract(uid))

    def unwant_prompt_end(self, request_id: str, told: Callable[[str], None]) -> None:
        self.commits.unwant_prompt_end(request_id, told)

    @property
    def busy(self) -> bool:
        """Work to step: a request in the batch, or one pending that is not only waiting
        for its file (the reader's `wake` rouses the loop then) or its room's Orders."""
        return bool(self.active) or self.admission.has_work

    def set_limits(self, max_batch_tokens: int | None, pool_limit: int | None) -> None:
        """The memory shares' bounds, known once the model is loaded (engine.config.memory)."""
        self.admission.max_batch_tokens = max_batch_tokens
        if pool_limit is not None:
            self.pool_limit = bound_pool(self.config.cache.ram_budget, pool_limit)

    @property
    def batch_tokens(self) -> int:
        """What admission counts against `max_batch_tokens` (Admission.batch_tokens)."""
        return self.admission.batch_tokens

    def will_capture(self, entry_id: int) -> bool:
        """Whether a request here (in the batch or pending) is yet to capture entry `entry_id`."""
        return self.admission.will_capture(entry_id)

    def reset(self, error: str) -> None:
        """The cache manager lost its state: end every request UNAVAILABLE, empty the RAM tier.

        Nothing is released or committed (the manager that planned them is
        gone); the entries' files stay on disk for the next plans to load.
        """
        for req, emit in [*self.pending, *self.restorer.replanning.values()]:
            emit(self._unstarted(req, FinishReason.UNAVAILABLE, error=error))
        self.admission.clear()
        self.restorer.clear()
        for uid, act in list(self.active.items()):
            self._forget(uid)
            act.emit(self._final_event(act, FinishReason.UNAVAILABLE, error=error))
        self.close()
        self.bg = new_batch_generator(self.model, self.config, self.profile, self.prefill_log)
        self.tier.clear()
        self.order_ledger.reset()  # the manager numbers its Orders anew
        self.commits.forget_wants()

    def fail_all(self, message: str) -> None:
        """After an error inside the batch: end every request and start a fresh batch."""
        for uid, act in list(self.active.items()):
            self._forget(uid)
            self._release(act.req)
            act.emit(self._final_event(act, FinishReason.ERROR, error=message))
        self.close()
        self.bg = new_batch_generator(self.model, self.config, self.profile, self.prefill_log)

    # ---- the loop ---------------------------------------------------------

    def step(self) -> None:
        """Admit pending requests, then one BatchGenerator step (timed by `profile`)."""
        self.profile.begin()
        try:
            self._step()
        finally:
            self.profile.end(self.bg.generating)

    def _step(self) -> None:
        # 1) Admit: each pending request that may start restores and joins the batch;
        #    the others wait, each for a reason (Admission.waits).
        for req, emit in self.admission.admissible():
            self._start(req, emit)
        if not self.active:
            return
        # 2) Prefills that reach an anchor a waiting request needs go first.
        if isinstance(self.bg, ChunkedBatchGenerator):
            self.bg.unblocks = self.admission.unblocks()
        # 3) One batch step: every running sequence decodes, a prefill chunk runs.
        prompt_responses, gen_responses = self.bg.next()
        # 4) Prefill: progress, capture points (an anchor commits at once), the prompt end.
        for r in prompt_responses:
            self._on_prompt(r)
        # 5) Decode: each token's id out; a finished request stores and commits.
        for r in gen_responses:
            self._on_token(r)

    # ---- admission and restore -------------------------------------------

    def _start(self, req: GenerationRequest, emit: Emit) -> None:
        """Admit one request; one that fails ends with an error, never failing the batch."""
        try:
            with self.profile.phase("admit"):
                self._admit(req, emit)
        except Exception as e:
            log.exception("request %s: admission failed", req.request_id)
            self._release(req)
            emit(self._unstarted(req, FinishReason.ERROR, error=f"{type(e).__name__}: {e}"))

    def _admit(self, req: GenerationRequest, emit: Emit) -> None:
        """Restore the plan's point and insert the prompt's remaining segments into the batch;
        a request of n branches forks the others at its prompt end (engine.runtime.branches)."""
        t0 = time.perf_counter()
        tokens = list(req.tokens)
        restored = self.restorer.restore(req, emit)
        if restored is None:  # its restore point is gone: admitted again with a new plan
            return
        self.timer.on_admit(req.request_id)
        n, cache = restored.length, restored.cache
        captures = sorted(
            (c for c in req.plan.captures if n < c.length < len(tokens)), key=lambda c: c.length
        )
        # Prefill stops at every capture point: one segment between two of them.
        cuts = [n] + [c.length for c in captures] + [len(tokens)]
        segments = [tokens[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
        stop_ids = self.eos_ids | frozenset(req.sampling.stop_token_ids)
        stops = StopSequences([[t] for t in sorted(stop_ids)])
        branches = req.sampling.n
        first = ActiveRequest(
            req=branch_request(req, 0) if branches > 1 else req,
            emit=emit,
            uid=-1,
            restore_kind=restored.kind,
            restore_length=n,
            captures=captures,
            stop_ids=stop_ids,
            stamps=Stamps(
                received=req.received_at,
                plan_ms=req.plan_ms,
                admitted=time.time(),
                restore_ms=(time.perf_counter() - t0) * 1000,
            ),
            restored_kv_bytes=restored.restored_kv,
            copied_restore=restored.copied,
            restore_lost=self.restorer.take_lost_point(req.request_id),
            # Matching starts at the first generated token.
            matcher=self.grammars.for_request(req.grammar, stop_ids),
            key=req.request_id,
            branches=branches,
        )
        acts = [first] + [
            branch_active(first, req, index, self.grammars.for_request(req.grammar, stop_ids))
            for index in range(1, branches)
        ]
        acts = [(act, make_sampler(act.req.sampling, self.vocab_size)) for act in acts]
        max_tokens = req.sampling.max_tokens
        if n == len(tokens):  # a verbatim resend: each first token from the kept logits
            logits = self.tier.logits(req.plan.entry_id, n)
            state = self.tier.entries[req.plan.entry_id].states.get(n)
            for act, sampler in acts:
                act.resent, act.prompt_end_logits, act.prompt_end_state = True, logits, state
                first, row = sample_first(logits, sampler or greedy, act.matcher)
                if not self._first_token(act, first, max_tokens - 1, row):
                    self._insert(act, [[first]], max_tokens - 1, cache, tokens[:n], sampler, stops)
            return
        parent, sampler = acts[0]
        self._insert(parent, segments, max_tokens, cache, tokens[:n], sampler, stops)
        if len(acts) > 1:  # forked from the parent's rows when its prompt ends
            uids = self.bg.new_uids(len(acts) - 1)
            forks = []
            for uid, (act, sampler) in zip(uids, acts[1:]):
                forks.append(Branch(uid, sampler, act.matcher, stops, max_tokens))
                self._enlist(act, uid)
            self.bg.fork(parent.uid, forks)

    def _insert(self, act, segments, max_tokens, cache, prefix, sampler, stops) -> None:
        """One sequence into the batch: its segments after the restored `prefix`."""
        uid = self.bg.insert_segments(
            [segments],
            max_tokens=[max_tokens],
            caches=[cache] if cache is not None else None,
            all_tokens=[prefix],
            samplers=[sampler],
            matchers=[act.matcher],  # its grammar's, kept by uid (structured.masked_batch)
            stop_sequences=[stops],
        )[0]
        self._enlist(act, uid)

    def _enlist(self, act: ActiveRequest, uid: int) -> None:
        act.uid = uid
        self.active[uid] = act
        self.by_request[act.key] = uid

    def _first_token(self, act: ActiveRequest, token: int, left: int, row) -> bool:
        """Emit a resend's first token, sampled at admission from `row`; True when it ends
        the request (a stop token, or max_tokens 1): then it is released, storing nothing."""
        act.stamps.token(time.time())
        stopped = token in act.stop_ids
        if not stopped:
            act.generated += 1
            act.emit(tokens_event(act, token, row))
        if not (stopped or left <= 0):
            return False
        self.timer.on_finish(act.req.request_id)
        self._release(act.req)
        reason = FinishReason.STOP if stopped else FinishReason.LENGTH
        act.emit(self._final_event(act, reason))
        return True

    # ---- prefill events ----------------------------------------------------

    def _log_prefill(self, act: ActiveRequest, uid: int) -> None:
        """The request's row in the prefill log: its clock and its chunks' track."""
        take = getattr(self.bg, "prefill_track", None)
        if take is None or act.index:  # batched: no chunk log; a branch: its first's row
            return
        shift = time.perf_counter() - time.time()  # Stamps' clock -> the log's
        self.prefill_log.request_row(
            take(uid),
            act.stamps.received + shift,
            act.stamps.admitted + shift,
            request_id=act.key,
            namespace=act.req.namespace,
            prompt_tokens=act.prompt_len,
            restored=act.restore_length,
        )

    def _on_prompt(self, r) -> None:
        act = self.active.get(r.uid)
        if act is None:
            return
        with self.profile.phase("capture"):
            self._prompt_event(act, r)

    def _prompt_event(self, act: ActiveRequest, r) -> None:
        done = act.restore_length + int(r.progress[0])
        due = done - act.progress_sent >= PROGRESS_MIN_TOKENS
        if act.prompt_len >= PROGRESS_MIN_TOKENS and not r.end_of_prompt and due:
            act.progress_sent = done
            act.emit(Progress(done=done, total=act.prompt_len))
        if r.end_of_prompt:
            act.stamps.prefill_end = time.time()
            self._log_prefill(act, r.uid)
            for index in range(1, act.branches):  # its branches, forked now
                branch = self.active.get(self.by_request.get(branch_key(act.key, index), -1))
                if branch is not None:
                    branch.stamps.prefill_end = act.stamps.prefill_end
            act.copied_restore += self.bg.restore_copies.pop(r.uid, 0)  # the batch merge
            if not act.resent:  # a resend's batch "prompt" is its first token: state kept
                act.prompt_end_state = self.bg.generation_state(r.uid)
                act.prompt_end_logits = self.bg.generation_logprobs(r.uid)
            if act.key in self.commits.wanted:  # another request waits for it: stored now
                self.commits.prompt_end(act, act.key, lambda: self.bg.generation_extract(r.uid))
        elif r.end_of_segment and act.captures and act.captures[0].length == done:
            point = act.captures.pop(0)
            if point.kind == CaptureKind.ANCHOR:
                self.commits.anchor(act, point, self.bg.prefill_extract(r.uid))
                return
            act.taken[point.length] = (point, self.bg.prefill_state(r.uid))

    # ---- decode events -----------------------------------------------------

    def _on_token(self, r) -> None:
        act = self.active.get(r.uid)
        if act is None:
            return
        token = int(r.token)
        act.stamps.token(time.time())
        if not (r.finish_reason == "stop" and token in act.stop_ids):  # a stop token: not sent
            act.generated += 1
            act.emit(tokens_event(act, token, r.logprobs))
        if r.finish_reason is not None:
            self._complete(act, FinishReason(r.finish_reason), r.prompt_cache, list(r.all_tokens))

    # ---- completion: store, commit, final event ------------------------------

    def _complete(
        self, act: ActiveRequest, reason: FinishReason, cache: list, all_tokens: list
    ) -> None:
        """A request is done: its entries are staged and its Commit sent (timed as the
        commit); its final event goes out with the Orders' answer."""
        with self.profile.phase("commit"):
            self._forget(act.uid)
            if act.req.plan.new_entry_id is None:
                self._release(act.req)
                act.emit(self._final_event(act, reason))
                return
            self.commits.finish(
                act,
                cache,
                all_tokens,
                self.bg.commit_copies.pop(act.uid, 0),
                answered=lambda ms: act.emit(self._final_event(act, reason, commit_ms=ms)),
                failed=lambda error: act.emit(
                    self._final_event(act, FinishReason.ERROR, error=error)
                ),
            )

    def _release(self, req: GenerationRequest) -> None:
        """Give a request's plan back to the manager, storing nothing."""
        self.commits.release(req)

    def _forget(self, uid: int) -> None:
        """The request of `uid` leaves the batch's books (the batch itself is done with it)."""
        self.bg.restore_copies.pop(uid, None)
        act = self.active.pop(uid, None)
        if act is not None:
            self.by_request.pop(act.key, None)
            self.timer.on_finish(act.req.request_id)

    # ---- Orders in -------------------------------------------------------------

    def apply_unasked(self, orders: Orders) -> None:
        """Orders that answer no call of this replica: decided at another replica's call
        (frees of an entry held here too), or a call's late answer after it was answered
        empty at its deadline."""
        self.order_ledger.received(orders)
        self.tier.apply(orders)

    # ---- final events --------------------------------------------------------

    def _final_event(
        self, act: ActiveRequest, reason: FinishReason, commit_ms: float = 0.0, error: str = ""
    ) -> Finished:
        self.restorer.take_lost_point(act.req.request_id)
        self.bg.commit_copies.pop(act.uid, None)
        batch_copied, drafts = self.bg.ledger.pop(act.uid), self.bg.draft_counts(act.uid)
        return act.final_event(reason, batch_copied, drafts, commit_ms, error)

    def _unstarted(self, req: GenerationRequest, reason: FinishReason, error: str = "") -> Finished:
        self.restorer.take_lost_point(req.request_id)
        return unstarted_event(req.request_id, len(req.tokens), reason, error)
