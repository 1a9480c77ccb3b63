"""Continuous batching with restores and capture points, over mlx-lm's BatchGenerator.

The generator knows tensors and the batch; it knows nothing about which entry
to restore or what to keep: a request arrives with its RestorePlan, and a
finished request leaves as a Commit for the cache manager, whose Orders come
back through `apply_orders`. Every method runs on one thread (the model
actor's loop); nothing here locks.

Capture points: the prompt is split into segments at each capture point, so
prefill stops exactly there (BatchGenerator's segments) and the state layers
of that sequence are snapshotted before the next chunk runs. The state at the
prompt end is taken when the sequence enters the generation batch (its last
prompt token has just been fed).

Ordering with the manager: its Orders come back numbered (`Orders.seq`), and
a plan names the last Orders handed out before it (`after_orders`). A request
whose plan is ahead of the Orders applied here waits in `pending` while a
cache call is still unanswered: the free, move or write it depends on is on
its way. A finished request's entry (and an anchor captured mid-prefill)
waits aside in the RAM tier (`RamTier.stage`) until the Orders answering its
commit come back, and enters the tier with them; a plan that loads a file
first asks for the Orders that make room for it (`CacheLink.room`). So the
tier holds no entry before the frees that make its room.

A restore point that turns out gone at admission is reported
(`CacheLink.replan`, a LostRestore); the request waits for its new plan, and
its final event names the lost point (`Finished.restore_lost`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

import numpy as np
from mlx_lm.generate import BatchGenerator, StopSequences

from engine.cache.kinds import CaptureKind, RestoreKind
from engine.cache.messages import (
    AnchorCommit,
    CapturedPoint,
    Commit,
    LostRestore,
    Orders,
    Release,
    Replanned,
)
from engine.config import EngineConfig
from engine.runtime import layer_caches
from engine.runtime.batch import LineageBatchGenerator, bound_pool
from engine.runtime.chunked import ChunkedBatchGenerator
from engine.runtime.events import Finished, FinishReason, Progress, Timing, Tokens
from engine.runtime.layer_timer import LayerTimer
from engine.runtime.prefill_worker import module_eval_default
from engine.runtime.ram_tier import RamTier, StoredEntry
from engine.runtime.requests import GenerationRequest
from engine.runtime.sampling import StopMatcher, make_sampler
from engine.runtime.scheduler import PrefillScheduler
from engine.runtime.step_profile import StepProfile

log = logging.getLogger(__name__)

Emit = Callable[[object], None]
OnOrders = Callable[[Orders], None]


class CacheLink(Protocol):
    """How the generator reaches the cache manager. Each call answers with Orders,
    handed to `on_orders` on the generator's own thread (never re-entrantly
    inside a step for a remote manager; at once for an in-process one)."""

    def commit(self, commit: Commit, on_orders: OnOrders) -> None: ...

    def commit_anchor(self, anchor: AnchorCommit, on_orders: OnOrders) -> None: ...

    def release(self, release: Release, on_orders: OnOrders) -> None: ...

    def replan(self, lost: LostRestore, on_replanned: Callable[[Replanned], None]) -> None: ...

    def room(self, request_id: str, on_orders: OnOrders) -> None: ...  # before a file load


PROGRESS_MIN_TOKENS = 256  # stream prefill progress only for prompts at least this long,
# and at most once per this many tokens: a chunk beside decode can be 4 tokens, and an
# event per chunk costs a decoding stream's step more than the chunk does


def _greedy(logprobs):
    """The batch's own default sampler (mlx-lm's: argmax), for a resend's first token."""
    import mlx.core as mx

    return mx.argmax(logprobs, axis=-1)


@dataclass
class _Active:
    """One request in the batch."""

    req: GenerationRequest
    emit: Emit
    uid: int
    restore_kind: RestoreKind
    restore_length: int
    captures: list  # pending CapturePoints, ascending
    stop_ids: frozenset
    t_admit: float
    restore_ms: float
    restored_kv_bytes: int
    copied_restore: int = 0
    copied_commit: int = 0
    progress_sent: int = 0  # prompt tokens done at the last Progress event
    taken: dict = field(default_factory=dict)  # length -> (CapturePoint, StateSnapshot)
    prompt_end_state: object = None
    prompt_end_logits: object = None  # what the first token was sampled from
    resent: bool = False  # restored at the prompt end: its first token came from stored logits
    restore_lost: str = ""  # "entry@length" of a planned restore found gone
    t_prefill_end: float | None = None
    t_first: float | None = None
    t_last: float | None = None
    ids: list = field(default_factory=list)  # emitted completion ids
    detok: object = None
    stop: StopMatcher | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.req.tokens)


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
        self.cache = cache
        self.vocab_size = int(model.args.vocab_size) if hasattr(model, "args") else len(tokenizer)
        self.eos_ids = frozenset(int(t) for t in tokenizer.eos_token_ids)
        self.pool_limit = bound_pool(config.cache.ram_budget, config.cache.pool_limit)
        # Prompt plus max_tokens of the running sequences together; None: no bound.
        self.max_batch_tokens: int | None = config.model.max_batch_tokens
        self.profile = StepProfile()  # where each step's wall time goes
        self.bg = self._new_batch_generator()
        self.active: dict[int, _Active] = {}  # uid -> request
        self.by_request: dict[str, int] = {}  # request_id -> uid
        self.pending: list[tuple[GenerationRequest, Emit]] = []
        self.replanning: dict[str, tuple[GenerationRequest, Emit]] = {}
        self.lost: dict[str, str] = {}  # request id -> the restore point found gone
        self.orders_applied = 0  # every Orders numbered up to this one is applied
        self._orders_seen: set[int] = set()  # applied, above orders_applied
        self._unanswered = 0  # cache calls sent whose Orders have not come back
        # Plans that load a file, by (request id, new entry id): the `seq` of the Orders
        # that made room for it, or None while that answer is on its way (CacheLink.room).
        self._rooms: dict[tuple[str, int | None], int | None] = {}
        self.wake: Callable[[], None] = lambda: None  # the loop sets it: a read has ended
        self.timer = LayerTimer(
            model, config.cache.layer_timer_flag, config.cache.layer_timer_requests
        )

    def close(self) -> None:
        """Close the batch generator (its prefill worker, mlx-lm's wired limit): once the
        loop stops, and before it is replaced."""
        self.bg.close()

    def _new_batch_generator(self) -> BatchGenerator:
        m = self.config.model
        common = dict(
            completion_batch_size=m.max_batch,
            prefill_batch_size=m.max_batch,
            prefill_step_size=m.prefill_step_size,
            clear_pool_per_prefill=self.config.cache.clear_pool_per_prefill,
        )
        if m.schedule == "batched":  # mlx-lm's padded prefill batch: the baseline
            return LineageBatchGenerator(self.model, **common)
        scheduler = PrefillScheduler(
            m.schedule,
            m.prefill_budget,
            m.prefill_group,
            step_factor=m.prefill_step_factor,
            slice_ms=m.prefill_slice_ms,
            overlap=m.prefill_overlap,
        )
        module_eval = {"module": True, "forward": False}.get(m.prefill_eval)
        return ChunkedBatchGenerator(
            self.model,
            scheduler=scheduler,
            profile=self.profile,
            module_eval=module_eval_default() if module_eval is None else module_eval,
            **common,
        )

    # ---- requests in ----------------------------------------------------

    def submit(self, req: GenerationRequest, emit: Emit) -> None:
        self.pending.append((req, self.profile.timed("emit", emit)))

    def cancel(self, request_id: str, on_done: Callable[[], None] | None = None) -> None:
        """Stop a request now: its slot is freed before the next decode step.

        `on_done` runs once what the request leaves behind is committed (or
        released): a retry planned after it sees that entry.
        """
        done = on_done or (lambda: None)
        if request_id in self.replanning:  # its new plan is on its way: release that one
            req, emit = self.replanning.pop(request_id)
            self._release(req)
            emit(self._finished_cold(req, FinishReason.CANCELLED))
            return done()
        for i, (req, emit) in enumerate(self.pending):
            if req.request_id == request_id:
                del self.pending[i]
                self._rooms.pop((request_id, req.plan.new_entry_id), None)
                self._release(req)
                emit(self._finished_cold(req, FinishReason.CANCELLED))
                return done()
        uid = self.by_request.get(request_id)
        if uid is None:
            return done()
        act = self.active[uid]
        emit = act.emit
        act.emit = lambda event: (emit(event), isinstance(event, Finished) and done())
        cache, tokens = self.bg.remove([uid], return_prompt_caches=True)[uid]
        if len(tokens) <= act.restore_length:  # not admitted to the batch yet: nothing new
            self._drop(uid)
            self._release(act.req)
            act.emit(self._finished(act, FinishReason.CANCELLED))
            return
        # In prefill, the prefix prefilled so far (and its captures) is still worth
        # keeping: a retry of a dropped long prompt resumes there.
        self._finish(act, FinishReason.CANCELLED, cache, list(tokens))

    @property
    def busy(self) -> bool:
        """Work to step: a request in the batch, or one pending that is not only waiting
        for its file (the reader's `wake` rouses the loop then) or its room's Orders."""
        if self.active:
            return True
        return any(not self._loading(req) and not self._asked(req) for req, _ in self.pending)

    def _asked(self, req: GenerationRequest) -> bool:
        """Its room's Orders are asked for and on their way (the answer rouses the loop)."""
        key = (req.request_id, req.plan.new_entry_id)
        return key in self._rooms and self._rooms[key] is None

    def set_limits(self, max_batch_tokens: int | None, pool_limit: int | None) -> None:
        """The memory plan's bounds, known once the model is loaded (engine.config.plan_memory)."""
        self.max_batch_tokens = max_batch_tokens
        if pool_limit is not None:
            self.pool_limit = bound_pool(self.config.cache.ram_budget, pool_limit)

    @property
    def batch_tokens(self) -> int:
        """Prompt plus max_tokens of the running sequences, plus the tokens of finished ones
        whose entries wait for their commit's Orders (still outside the RAM tier): what
        admission counts."""
        running = sum(_tokens_needed(a.req) for a in self.active.values())
        return running + self.tier.staged_tokens

    def reset(self, error: str) -> None:
        """The cache manager lost its state: end every request UNAVAILABLE, empty the RAM tier.

        Nothing is released or committed (the manager that planned them is
        gone); the entries' files stay on disk for the next plans to load.
        """
        for req, emit in [*self.pending, *self.replanning.values()]:
            emit(self._finished_cold(req, FinishReason.UNAVAILABLE, error=error))
        self.pending, self.replanning, self.lost = [], {}, {}
        for uid, act in list(self.active.items()):
            self._drop(uid)
            act.emit(self._finished(act, FinishReason.UNAVAILABLE, error=error))
        self.close()
        self.bg = self._new_batch_generator()
        self.tier.clear()
        # The manager numbers its Orders anew; answers still on their way are dropped.
        self.orders_applied, self._orders_seen, self._unanswered = 0, set(), 0
        self._rooms = {}

    # ---- the loop ---------------------------------------------------------

    def step(self) -> None:
        """Admit pending requests, then one BatchGenerator step (timed by `profile`)."""
        self.profile.begin()
        try:
            self._step()
        finally:
            self.profile.end(self.bg.generating)

    def _step(self) -> None:
        waiting = []
        budget_full = False  # once one request waits for room, later ones wait behind it
        while self.pending:
            req, emit = self.pending.pop(0)
            loading = self._loading(req)  # the read and the room's Orders overlap
            if self._orders_behind(req.plan) or self._must_wait(req) or self._no_room(req):
                waiting.append((req, emit))
                continue
            if loading:
                waiting.append((req, emit))
                continue
            if budget_full or not self._fits(req):
                budget_full = True
                waiting.append((req, emit))
                continue
            try:
                with self.profile.phase("admit"):
                    self._admit(req, emit)
            except Exception as e:  # one bad request must not fail the batch
                log.exception("request %s: admission failed", req.request_id)
                self._release(req)
                emit(self._finished_cold(req, FinishReason.ERROR, error=f"{type(e).__name__}: {e}"))
        self.pending = waiting
        if not self.active:
            return
        if isinstance(self.bg, ChunkedBatchGenerator):
            self.bg.unblocks = self._unblocks(waiting)
        prompt_responses, gen_responses = self.bg.next()
        for r in prompt_responses:
            self._on_prompt(r)
        for r in gen_responses:
            self._on_token(r)

    def _loading(self, req: GenerationRequest) -> bool:
        """Its restore source is being read on the reader thread (others keep decoding)."""
        future = self.tier.start_load(req.plan, self.wake)
        return future is not None and not future.done()

    def _no_room(self, req: GenerationRequest) -> bool:
        """A plan that loads a file waits for the Orders that make room for its entry
        (the frees of what the manager evicted for it at the plan): asked once, here."""
        plan = req.plan
        if not plan.load_from_disk or self.tier.disk_tier is None:
            return False
        if self.tier.can_restore(plan.entry_id, plan.length):
            return False
        key = (req.request_id, plan.new_entry_id)
        if key not in self._rooms:
            self._rooms[key] = None
            self._unanswered += 1
            self.cache.room(req.request_id, lambda orders: self._roomed(key, orders))
        seq = self._rooms.get(key)
        return seq is None or (seq > self.orders_applied and self._unanswered > 0)

    def _roomed(self, key: tuple, orders: Orders) -> None:
        self.apply_orders(orders)
        if key in self._rooms:
            self._rooms[key] = orders.seq

    def _orders_behind(self, plan) -> bool:
        """Orders handed out before this plan are still on their way here."""
        return plan.after_orders > self.orders_applied and self._unanswered > 0

    def _fits(self, req: GenerationRequest) -> bool:
        """Whether the request's tokens fit beside the running ones (an empty batch takes any)."""
        if self.max_batch_tokens is None or not self.active:
            return True
        return self.batch_tokens + _tokens_needed(req) <= self.max_batch_tokens

    def _must_wait(self, req: GenerationRequest) -> bool:
        """A plan waiting on an anchor that a request still in prefill will capture, or on
        an entry staged here until its commit's Orders come back."""
        plan = req.plan
        if self.tier.staged(plan.entry_id):  # stored here; its commit's Orders are coming
            return True
        if not plan.wait or self.tier.can_restore(plan.entry_id, plan.length):
            return False
        planned = [a.captures for a in self.active.values()]
        planned += [[c for c in r.plan.captures] for r, _ in self.pending if r is not req]
        return any(c.entry_id == plan.entry_id for caps in planned for c in caps)

    def _unblocks(self, waiting: list) -> dict[int, int]:
        """uid -> its prompt tokens (from its restore point) up to an anchor `waiting` await."""
        wanted = {req.plan.entry_id for req, _ in waiting}
        out = {}
        for act in self.active.values():
            for point in act.captures:
                if point.kind == CaptureKind.ANCHOR and point.entry_id in wanted:
                    out[act.uid] = point.length - act.restore_length
                    break
        return out

    def will_capture(self, entry_id: int) -> bool:
        """Whether a request here (in the batch or pending) is yet to capture entry `entry_id`."""
        planned = [a.captures for a in self.active.values()]
        planned += [r.plan.captures for r, _ in self.pending]
        return any(c.entry_id == entry_id for caps in planned for c in caps)

    def fail_all(self, message: str) -> None:
        """After an error inside the batch: end every request and start a fresh batch."""
        for uid, act in list(self.active.items()):
            self._drop(uid)
            self._release(act.req)
            act.emit(self._finished(act, FinishReason.ERROR, error=message))
        self.close()
        self.bg = self._new_batch_generator()

    # ---- admission and restore -------------------------------------------

    def _admit(self, req: GenerationRequest, emit: Emit) -> None:
        """Restore the plan's point and insert the prompt's remaining segments into the batch."""
        t0 = time.perf_counter()
        tokens = list(req.tokens)
        self._rooms.pop((req.request_id, req.plan.new_entry_id), None)
        restored = self._restore(req, emit)
        if restored is None:  # its restore point is gone: admitted again with a new plan
            return
        self.timer.on_admit(req.request_id)
        kind, n, cache, restored_kv, copied = restored
        captures = sorted(
            (c for c in req.plan.captures if n < c.length < len(tokens)), key=lambda c: c.length
        )
        # Prefill stops at every capture point: one segment between two of them.
        cuts = [n] + [c.length for c in captures] + [len(tokens)]
        segments = [tokens[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
        stop_ids = self.eos_ids | frozenset(req.sampling.stop_token_ids)
        sampler = make_sampler(req.sampling, self.vocab_size)
        max_tokens, first, logits = req.sampling.max_tokens, None, None
        if n == len(tokens):  # a verbatim resend: the first token from the kept logits
            logits = self.tier.logits(req.plan.entry_id, n)
            first = int((sampler or _greedy)(logits[None])[0].item())
            segments, max_tokens = [[first]], max_tokens - 1
        act = _Active(
            req=req,
            emit=emit,
            uid=-1,
            restore_kind=kind,
            restore_length=n,
            captures=captures,
            stop_ids=stop_ids,
            t_admit=time.time(),
            restore_ms=(time.perf_counter() - t0) * 1000,
            restored_kv_bytes=restored_kv,
            copied_restore=copied,
            detok=self.tokenizer.detokenizer,
            stop=StopMatcher(req.sampling.stop),
            restore_lost=self.lost.pop(req.request_id, ""),
        )
        if first is not None:
            act.resent, act.prompt_end_logits = True, logits
            act.prompt_end_state = self.tier.entries[req.plan.entry_id].states.get(n)
            if self._first_token(act, first, max_tokens):
                return  # done at its first token: nothing new to store
        act.uid = self.bg.insert_segments(
            [segments],
            max_tokens=[max_tokens],
            caches=[cache] if cache is not None else None,
            all_tokens=[tokens[:n]],
            samplers=[sampler],
            stop_sequences=[StopSequences([[t] for t in sorted(stop_ids)])],
        )[0]
        self.active[act.uid] = act
        self.by_request[req.request_id] = act.uid

    def _first_token(self, act: _Active, token: int, left: int) -> bool:
        """Emit a resend's first token, sampled at admission; True when it ends the request
        (a stop token or string, or max_tokens 1): then it is released, storing nothing."""
        act.t_first = act.t_last = time.time()
        stopped = token in act.stop_ids
        if not stopped:
            act.ids.append(token)
            act.detok.add_token(token)
            text, stopped = act.stop.feed(act.detok.last_segment)
            act.emit(Tokens(ids=(token,), text=text))
        if not (stopped or left <= 0):
            return False
        if not stopped:
            act.detok.finalize()
            tail = act.stop.feed(act.detok.last_segment)[0] + act.stop.flush()
            if tail:
                act.emit(Tokens(ids=(), text=tail))
        self.timer.on_finish(act.req.request_id)
        self._release(act.req)
        reason = FinishReason.STOP if stopped else FinishReason.LENGTH
        act.emit(self._finished(act, reason))
        return True

    def _restore(self, req: GenerationRequest, emit: Emit):
        """(kind, length, layer caches or None, restored KV bytes, bytes copied) of the plan.

        A restore point the RAM tier no longer holds (nor can load) goes back to
        the manager for a new plan (None: the request waits for it); found gone
        again, it falls back to a cold prefill. Both are logged and counted.
        """
        plan = req.plan
        kind, n = plan.kind, plan.length
        loaded = self.tier.prepare(plan, req.namespace, req.tokens)  # a disk entry into RAM
        whole = n == len(req.tokens)  # a resend restores the prompt end and its logits
        gone = not self.tier.can_restore(plan.entry_id, n) or (
            whole and self.tier.logits(plan.entry_id, n) is None
        )
        if n and gone:
            first = req.request_id not in self.lost
            self.lost[req.request_id] = f"{plan.entry_id}@{n}"
            log.warning(
                "request %s: restore point %s@%d is gone; %s",
                req.request_id,
                plan.entry_id,
                n,
                "asking for a new plan" if first else "prefilling cold",
            )
            if first:
                self.replanning[req.request_id] = (req, emit)
                lost = LostRestore(req.request_id, plan.entry_id, n, load_failed=not loaded)
                self._unanswered += 1
                self.cache.replan(lost, self._on_replanned)
                return None
            kind, n = RestoreKind.NONE, 0
        if not n:
            return kind, 0, None, 0, 0
        counter = layer_caches.CopyCounter()
        cache = self.tier.restore(plan.entry_id, n, counter)
        restored_kv = layer_caches.kv_bytes_per_token(self.tier.entries[plan.entry_id].layers) * n
        return kind, n, cache, restored_kv, counter.copied_kv

    # ---- prefill events ----------------------------------------------------

    def _on_prompt(self, r) -> None:
        act = self.active.get(r.uid)
        if act is None:
            return
        with self.profile.phase("capture"):
            self._prompt_event(act, r)

    def _prompt_event(self, act: _Active, r) -> None:
        done = act.restore_length + int(r.progress[0])
        due = done - act.progress_sent >= PROGRESS_MIN_TOKENS
        if act.prompt_len >= PROGRESS_MIN_TOKENS and not r.end_of_prompt and due:
            act.progress_sent = done
            act.emit(Progress(done=done, total=act.prompt_len))
        if r.end_of_prompt:
            act.t_prefill_end = time.time()
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

    def _commit_anchor(self, act: _Active, point, extracted: list) -> None:
        """Store an anchor the moment prefill reaches it, and index it now.

        Requests waiting on the same system prompt restore it at once instead of
        prefilling it again. Costs one copy of the anchor's rows (the extraction),
        once per distinct system prompt.
        """
        layers, state = layer_caches.store_entry(extracted)
        ticket = f"{act.req.request_id}#{point.entry_id}"
        anchor = StoredEntry(layers, point.length, {point.length: state})
        self.tier.stage(ticket, [(point.entry_id, anchor)], point.length)
        self._unanswered += 1
        self.cache.commit_anchor(
            AnchorCommit(
                request_id=act.req.request_id,
                namespace=act.req.namespace,
                entry_id=point.entry_id,
                tokens=np.asarray(act.req.tokens[: point.length], dtype=np.int32),
                kv_bytes_per_token=layer_caches.kv_bytes_per_token(layers),
                state_bytes=state.nbytes,
            ),
            lambda orders: self._land(ticket, orders),
        )

    # ---- decode events -----------------------------------------------------

    def _on_token(self, r) -> None:
        act = self.active.get(r.uid)
        if act is None:
            return
        now = time.time()
        token = int(r.token)
        if act.t_first is None:
            act.t_first = now
        act.t_last = now
        is_stop_token = r.finish_reason == "stop" and token in act.stop_ids
        stopped = False
        if not is_stop_token:
            act.ids.append(token)
            act.detok.add_token(token)
            text, stopped = act.stop.feed(act.detok.last_segment)
            act.emit(Tokens(ids=(token,), text=text))
        if stopped:
            if r.finish_reason is None:  # still in the batch: take it out with its cache
                cache, tokens = self.bg.remove([r.uid], return_prompt_caches=True)[r.uid]
            else:  # the batch ended it on this very token (max_tokens): it is gone from there
                cache, tokens = r.prompt_cache, r.all_tokens
            self._finish(act, FinishReason.STOP, cache, list(tokens))
        elif r.finish_reason is not None:
            act.detok.finalize()
            tail = act.stop.feed(act.detok.last_segment)[0] + act.stop.flush()
            if tail:
                act.emit(Tokens(ids=(), text=tail))
            self._finish(act, FinishReason(r.finish_reason), r.prompt_cache, list(r.all_tokens))

    # ---- finishing: store, commit, final event ------------------------------

    def _finish(self, act: _Active, reason: FinishReason, cache: list, all_tokens: list) -> None:
        with self.profile.phase("commit"):
            self._commit(act, reason, cache, all_tokens)

    def _commit(self, act: _Active, reason: FinishReason, cache: list, all_tokens: list) -> None:
        self._drop(act.uid)
        plan = act.req.plan
        if plan.new_entry_id is None:
            self._release(act.req)
            act.emit(self._finished(act, reason))
            return
        t0 = time.perf_counter()
        ticket = f"{act.req.request_id}#{plan.new_entry_id}"
        try:
            commit = self._store(act, cache, all_tokens, ticket)
        except Exception as e:  # the stream still ends, and the ids go back
            log.exception("request %s: storing its cache failed", act.req.request_id)
            self._release(act.req)
            act.emit(self._finished(act, FinishReason.ERROR, error=f"{type(e).__name__}: {e}"))
            return

        def on_orders(orders: Orders) -> None:
            self._land(ticket, orders)
            commit_ms = (time.perf_counter() - t0) * 1000
            act.emit(self._finished(act, reason, commit_ms=commit_ms))

        self._unanswered += 1
        self.cache.commit(commit, on_orders)

    def _store(self, act: _Active, cache: list, all_tokens: list, ticket: str) -> Commit:
        """Stage the finished sequence's entry (and separate capture entries) under `ticket`:
        they enter the RAM tier with the Orders answering the Commit returned."""
        plan = act.req.plan
        L = act.prompt_len
        counter = layer_caches.CopyCounter()
        layers, end_state = layer_caches.store_entry(cache, counter)
        # What the snapshot code copied (the end state), the states captured in
        # prefill and at the prompt end (each a copy), and the batch's copying
        # extractions (several sequences finishing at once, an anchor mid-prefill).
        captured = [s for _, s in act.taken.values()]
        if act.prompt_end_state is not None and not act.resent:  # a resend's is shared
            captured.append(act.prompt_end_state)
        act.copied_commit = (
            counter.copied_kv
            + counter.copied_state
            + sum(s.nbytes for s in captured)
            + self.bg.commit_copies.pop(act.uid, 0)
        )
        tokens = np.asarray(all_tokens, dtype=np.int32)
        if act.prompt_end_state is None:  # cancelled in prefill: the prefix done so far
            L = length = int(tokens.shape[0])
            states = {length: end_state}
        elif plan.store_reply:
            length, states = int(tokens.shape[0]), {int(tokens.shape[0]): end_state}
            if length > L:
                states[L] = act.prompt_end_state
        else:
            length, states = L, {L: act.prompt_end_state}
            tokens = tokens[:L]
        assert tokens.shape[0] >= L, "the cache holds fewer tokens than the prompt"
        captured, staged = [], []
        for point, state in act.taken.values():
            if point.entry_id is None:
                states[point.length] = state
            else:
                staged.append(
                    (point.entry_id, StoredEntry(layers, point.length, {point.length: state}))
                )
            captured.append(CapturedPoint(point.length, point.kind, point.entry_id))
        logits = {}
        # Kept where a resend can use them: a lineage entry's prompt end (exact mode's
        # snapshots are matched one token short, and its index does not count them).
        if act.prompt_end_logits is not None and L in states and plan.store_reply:
            logits = {L: act.prompt_end_logits}
        staged.append((plan.new_entry_id, StoredEntry(layers, length, states, logits)))
        self.tier.stage(ticket, staged, length)
        return Commit(
            request_id=act.req.request_id,
            namespace=act.req.namespace,
            entry_id=plan.new_entry_id,
            tokens=tokens,
            prompt_len=L,
            restored_from=plan.entry_id if act.restore_length else None,
            restored_length=act.restore_length,
            captures=tuple(captured),
            kv_bytes_per_token=layer_caches.kv_bytes_per_token(layers),
            state_bytes=end_state.nbytes,
            logits_at=L if logits else None,
            logits_bytes=sum(a.nbytes for a in logits.values()),
        )

    def _on_replanned(self, replanned: Replanned) -> None:
        """A lost restore's new plan: the request goes back to the head of `pending`."""
        self.apply_orders(replanned.orders)
        if replanned.plan is None:  # the manager no longer plans it (a failed call)
            return
        waiting = self.replanning.pop(replanned.plan.request_id, None)
        if waiting is None:  # cancelled meanwhile: the new plan's ids go back
            self.cache.release(Release(request_id=replanned.plan.request_id), self.apply_orders)
            self._unanswered += 1
            return
        req, emit = waiting
        self.pending.insert(0, (replace(req, plan=replanned.plan), emit))

    def _land(self, ticket: str, orders: Orders) -> None:
        """A commit's answer: its staged entries enter the tier, then its Orders apply."""
        self.tier.land(ticket)
        self.apply_orders(orders)
        self.tier.note_peak()

    def apply_orders(self, orders: Orders) -> None:
        """The manager's answer to one of this generator's cache calls (in whatever order)."""
        self._unanswered = max(0, self._unanswered - 1)
        self.obey(orders)

    def obey(self, orders: Orders) -> None:
        """Apply the manager's Orders: an answer, or Orders it sent unasked (for an entry
        this replica holds too)."""
        if orders.seq:
            self._orders_seen.add(orders.seq)
            while self.orders_applied + 1 in self._orders_seen:
                self.orders_applied += 1
                self._orders_seen.discard(self.orders_applied)
        if not self._unanswered and self._orders_seen:  # the rest went to another replica
            self.orders_applied = max(self.orders_applied, *self._orders_seen)
            self._orders_seen.clear()
        if orders:
            self.tier.apply(orders)

    def _release(self, req: GenerationRequest) -> None:
        if req.plan.new_entry_id is not None:
            self._unanswered += 1
            self.cache.release(Release(request_id=req.request_id), self.apply_orders)

    def _drop(self, uid: int) -> None:
        self.bg.restore_copies.pop(uid, None)
        act = self.active.pop(uid, None)
        if act is not None:
            self.by_request.pop(act.req.request_id, None)
            self.timer.on_finish(act.req.request_id)

    # ---- final events --------------------------------------------------------

    def _finished(
        self, act: _Active, reason: FinishReason, commit_ms: float = 0.0, error: str = ""
    ) -> Finished:
        t_first = act.t_first
        n = len(act.ids)
        decode_tps = 0.0
        if t_first is not None and act.t_last is not None and act.t_last > t_first and n > 1:
            decode_tps = (n - 1) / (act.t_last - t_first)
        received = act.req.received_at
        timing = Timing(
            queue_ms=max(0.0, (act.t_admit - received) * 1000 - act.req.plan_ms),
            plan_ms=act.req.plan_ms,
            restore_ms=act.restore_ms,
            prefill_ms=((act.t_prefill_end or time.time()) - act.t_admit) * 1000,
            commit_ms=commit_ms,
            ttft_ms=((t_first - received) * 1000) if t_first else 0.0,
            decode_tps=decode_tps,
            bytes_copied_restore=act.copied_restore,
            bytes_copied_commit=act.copied_commit,
            restored_kv_bytes=act.restored_kv_bytes,
            bytes_copied_batch=self.bg.ledger.pop(act.uid),
        )
        self.lost.pop(act.req.request_id, None)
        self.bg.commit_copies.pop(act.uid, None)
        return Finished(
            request_id=act.req.request_id,
            finish_reason=reason,
            prompt_tokens=act.prompt_len,
            cached_tokens=act.restore_length,
            completion_tokens=n,
            restore_kind=act.restore_kind,
            restore_length=act.restore_length,
            timing=timing,
            error=error,
            restore_lost=act.restore_lost,
        )

    def _finished_cold(
        self, req: GenerationRequest, reason: FinishReason, error: str = ""
    ) -> Finished:
        self.lost.pop(req.request_id, None)
        return Finished(
            request_id=req.request_id,
            finish_reason=reason,
            prompt_tokens=len(req.tokens),
            cached_tokens=0,
            completion_tokens=0,
            restore_kind=RestoreKind.NONE,
            restore_length=0,
            error=error,
        )


def _tokens_needed(req: GenerationRequest) -> int:
    return len(req.tokens) + req.sampling.max_tokens
