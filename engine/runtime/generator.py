"""Continuous batching with restores and capture points, over mlx-lm's BatchGenerator.

The generator knows tensors and the batch; it knows nothing about which entry
to restore or what to keep: a request arrives with its RestorePlan, and a
finished request leaves as a Commit for the cache manager, whose Orders come
back through the order ledger. Every method runs on one thread (the model
actor's loop); nothing here locks.

It is the step loop that composes three parts:
- `Admission` (engine.runtime.admission): what waits, what fits, and why;
- `OrderLedger` (engine.runtime.ordering): every call to the cache manager
  goes through it, which counts the calls until answered and numbers the
  Orders applied, so a plan restores only after the Orders it follows;
- `final_event` (engine.runtime.output): the Finished event.

It emits token ids only. Detokenizing and stop strings are the front end's
(engine.server.front.text), which handles a whole step's tokens at once: the loop
only computes, samples and stops at a stop token, max_tokens, or when the
front end says a stop string ended the text (`cancel(..., reason=STOP)`).

Capture points: the prompt is split into segments at each capture point, so
prefill stops exactly there (BatchGenerator's segments) and the state layers
of that sequence are snapshotted before the next chunk runs. The state at the
prompt end is taken when the sequence enters the generation batch (its last
prompt token has just been fed).

Staging: a finished request's entry (and an anchor captured mid-prefill)
waits aside in the RAM tier under a staging key (`RamTier.stage`) until the
Orders answering its commit come back, and enters the tier with them
(`RamTier.enter`); a plan that loads a file first asks for the Orders that
make room for it (Admission, `CacheLink.room`). So the tier holds no entry
before the frees that make its room.

A restore point that turns out gone at admission is reported
(`CacheLink.replan`, a LostRestore); the request waits for its new plan, and
its final event names the lost point (`Finished.restore_lost`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np
from mlx_lm.generate import StopSequences

from engine.cache.kinds import CaptureKind
from engine.cache.messages import AnchorCommit, Orders, Release
from engine.cache.shared_rows import prefix_source
from engine.config import EngineConfig
from engine.runtime import layer_caches
from engine.runtime.active import ActiveRequest
from engine.runtime.admission import Admission
from engine.runtime.batching.batch import bound_pool
from engine.runtime.batching.chunked import ChunkedBatchGenerator
from engine.runtime.batching.for_schedule import new_batch_generator
from engine.runtime.batching.layer_timer import LayerTimer
from engine.runtime.batching.prefill_log import PrefillLog
from engine.runtime.batching.step_profile import StepProfile
from engine.runtime.branches import Branch, branch_key, branch_request
from engine.runtime.events import Emit, Finished, FinishReason, Progress
from engine.runtime.logprobs import tokens_event
from engine.runtime.ordering import CacheLink, OrderLedger
from engine.runtime.output import Copied, Stamps, final_event, unstarted_event
from engine.runtime.packed_state import pack_snapshot
from engine.runtime.requests import GenerationRequest
from engine.runtime.sampling import make_sampler
from engine.runtime.structured.masked_batch import sample_first
from engine.runtime.structured.matcher import Grammars
from engine.runtime.tier.finished_entries import finished_entries
from engine.runtime.tier.ram import Prefix, RamTier, StoredEntry, digest
from engine.runtime.tier.restore import Restorer

log = logging.getLogger(__name__)

PROGRESS_MIN_TOKENS = 256  # stream prefill progress only for prompts at least this long,
# and at most once per this many tokens: a chunk beside decode can be 4 tokens, and an
# event per chunk costs a decoding stream's step more than the chunk does


def _greedy(logprobs):
    """The batch's own default sampler (mlx-lm's: argmax), for a resend's first token."""
    import mlx.core as mx

    return mx.argmax(logprobs, axis=-1)


def _staging_key(request_id: str, entry_id: int) -> str:
    """The key a commit's new entries wait under in the RAM tier until its Orders come."""
    return f"{request_id}#{entry_id}"


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
        lost = self.restorer.take_lost_point(req.request_id)
        acts = []
        for index in range(req.sampling.n):
            breq = branch_request(req, index) if req.sampling.n > 1 else req
            act = ActiveRequest(
                req=breq,
                emit=emit,
                uid=-1,
                restore_kind=restored.kind,
                restore_length=n,
                captures=captures if index == 0 else [],
                stop_ids=stop_ids,
                stamps=Stamps(
                    received=req.received_at,
                    plan_ms=req.plan_ms,
                    admitted=time.time(),
                    restore_ms=(time.perf_counter() - t0) * 1000,
                ),
                restored_kv_bytes=restored.restored_kv,
                copied_restore=restored.copied if index == 0 else 0,
                restore_lost=lost,
                # Matching starts at the first generated token.
                matcher=self._matcher(req.grammar, stop_ids),
                index=index,
                key=branch_key(req.request_id, index),
                branches=req.sampling.n if index == 0 else 1,
            )
            acts.append((act, make_sampler(breq.sampling, self.vocab_size)))
        max_tokens = req.sampling.max_tokens
        if n == len(tokens):  # a verbatim resend: each first token from the kept logits
            logits = self.tier.logits(req.plan.entry_id, n)
            state = self.tier.entries[req.plan.entry_id].states.get(n)
            for act, sampler in acts:
                act.resent, act.prompt_end_logits, act.prompt_end_state = True, logits, state
                first, row = sample_first(logits, sampler or _greedy, act.matcher)
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

    def _matcher(self, grammar, stop_ids):
        """A fresh matcher for the request's grammar; an optional grammar (the engine's own)
        that does not compile leaves the request unconstrained (the front end checked it:
        this is the backstop)."""
        if grammar is None:
            return None
        try:
            return self.grammars.matcher(grammar, stop_ids)
        except ValueError as e:
            if not grammar.optional:
                raise
            log.warning("the %s grammar does not compile; unconstrained: %s", grammar.kind, e)
            return None

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
        elif r.end_of_segment and act.captures and act.captures[0].length == done:
            point = act.captures.pop(0)
            if point.kind == CaptureKind.ANCHOR:
                self._commit_anchor(act, point, self.bg.prefill_extract(r.uid))
                return
            act.taken[point.length] = (point, self.bg.prefill_state(r.uid))

    def _commit_anchor(self, act: ActiveRequest, point, extracted: list) -> None:
        """Store an anchor the moment prefill reaches it, and index it now.

        Requests waiting on the same system prompt restore it at once instead of
        prefilling it again. Costs one copy of the anchor's rows (the extraction),
        once per distinct system prompt.
        """
        layers, state = layer_caches.store_entry(extracted)
        layers = layer_caches.pack_rows(layers, self.config.cache.stored_kv_precision)
        state = pack_snapshot(state, self.config.cache.stored_precision)
        key = _staging_key(act.req.request_id, point.entry_id)
        tokens = np.asarray(act.req.tokens[: point.length], dtype=np.int32)
        anchor = StoredEntry(layers, point.length, {point.length: state}, tokens=tokens)
        act.anchor = (point.entry_id, point.length)
        anchor.digests[point.length] = digest(act.req.tokens[: point.length])
        self.tier.stage(key, [(point.entry_id, anchor)], point.length)
        self.order_ledger.commit_anchor(
            AnchorCommit(
                request_id=act.req.request_id,
                namespace=act.req.namespace,
                entry_id=point.entry_id,
                tokens=tokens,
                kv_bytes_per_token=layer_caches.kv_bytes_per_token(layers),
                state_bytes=state.nbytes,
            ),
            lambda orders: self._enter_tier(key, orders),
        )

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
        """A request is done: its entry is staged and committed (timed as the commit)."""
        with self.profile.phase("commit"):
            self._commit(act, reason, cache, all_tokens)

    def _commit(
        self, act: ActiveRequest, reason: FinishReason, cache: list, all_tokens: list
    ) -> None:
        """Stage its entries and send the Commit; the final event goes out with the answer."""
        self._forget(act.uid)
        plan = act.req.plan
        if plan.new_entry_id is None:
            self._release(act.req)
            act.emit(self._final_event(act, reason))
            return
        t0 = time.perf_counter()
        key = _staging_key(act.req.request_id, plan.new_entry_id)
        try:
            precision = self.config.cache.stored_precision
            kv = self.config.cache.stored_kv_precision
            finished = finished_entries(act, cache, all_tokens, precision, self._prefix(act), kv)
        except Exception as e:  # the stream still ends, and the ids go back
            log.exception("request %s: storing its cache failed", act.req.request_id)
            self._release(act.req)
            act.emit(self._final_event(act, FinishReason.ERROR, error=f"{type(e).__name__}: {e}"))
            return

        # Its snapshots' copies, and the batch's copying extractions (several sequences
        # finishing at once, an anchor mid-prefill).
        act.copied_commit = finished.copied + self.bg.commit_copies.pop(act.uid, 0)
        self.tier.stage(key, finished.entries, finished.tokens)

        def on_orders(orders: Orders) -> None:
            self._enter_tier(key, orders)
            commit_ms = (time.perf_counter() - t0) * 1000
            act.emit(self._final_event(act, reason, commit_ms=commit_ms))

        self.order_ledger.commit(finished.commit, on_orders)

    def _prefix(self, act: ActiveRequest) -> Prefix | None:
        """The entry `act`'s new entry reads its first rows from (the anchor it stored, or
        the restore source that stays: engine.cache.shared_rows), if the tier holds it."""
        cfg = self.config.cache
        found = prefix_source(act.req.plan.shares, act.anchor, cfg.shared_rows_min)
        held = self.tier.held(found[0]) if found is not None else None
        if held is None or held.length < found[1]:
            return None
        return Prefix(found[0], held, found[1])

    def _release(self, req: GenerationRequest) -> None:
        """Give a request's plan back to the manager, storing nothing (its ids are freed)."""
        if req.plan.new_entry_id is not None:
            self.order_ledger.release(Release(request_id=req.request_id), self.tier.apply)

    def _forget(self, uid: int) -> None:
        """The request of `uid` leaves the batch's books (the batch itself is done with it)."""
        self.bg.restore_copies.pop(uid, None)
        act = self.active.pop(uid, None)
        if act is not None:
            self.by_request.pop(act.key, None)
            self.timer.on_finish(act.req.request_id)

    # ---- Orders in -------------------------------------------------------------

    def _enter_tier(self, key: str, orders: Orders) -> None:
        """A commit's answer: its staged entries enter the tier, then its Orders apply (in
        one loop-thread call: their moves and writes need the new entries, their frees
        make its room)."""
        self.tier.enter(key)
        self.tier.apply(orders)  # notes the tier's peak

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
        copied = Copied(
            restore=act.copied_restore,
            commit=act.copied_commit,
            restored_kv=act.restored_kv_bytes,
            batch=self.bg.ledger.pop(act.uid),
        )
        return final_event(
            act.req.request_id,
            reason,
            prompt_tokens=act.prompt_len,
            completion_tokens=act.generated,
            restore_kind=act.restore_kind,
            restore_length=act.restore_length,
            stamps=act.stamps,
            copied=copied,
            commit_ms=commit_ms,
            error=error,
            restore_lost=act.restore_lost,
            drafts=self.bg.draft_counts(act.uid),
            incomplete=act.matcher is not None and not act.matcher.accepting(),
            index=act.index,
        )

    def _unstarted(self, req: GenerationRequest, reason: FinishReason, error: str = "") -> Finished:
        self.restorer.take_lost_point(req.request_id)
        return unstarted_event(req.request_id, len(req.tokens), reason, error)
