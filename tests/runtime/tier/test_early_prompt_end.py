"""A prompt end stored early for a request waiting on one in flight (real MLX, no Ray).

Asked for while that request decodes, it is stored from the request's caches
extracted then, which hold its reply's rows so far too: the entry keeps the
prompt's rows only, in buffers of its own, so the tier holds what the index
charges it (the prompt's tokens), and a waiter restores it whole. Its waiters
are told once it is indexed or the request is over: not when one of the
request's other branches (n > 1) ends first.
"""

from __future__ import annotations

import time

import numpy as np

from engine.cache.messages import PlanRequest, Release
from engine.runtime import layer_caches
from engine.runtime.events import Finished, FinishReason
from engine.runtime.local import LocalEngine, LocalLink
from engine.runtime.requests import GenerationRequest, SamplingParams

PROMPT = 700
DECODED = 24  # tokens decoded before the waiter asks


def _step_until(engine: LocalEngine, done, limit: float = 120.0) -> None:
    end = time.monotonic() + limit
    while not done():
        assert time.monotonic() < end, "stuck"
        engine.generator.step()


def _submit_first(engine: LocalEngine, seed: int, sampling: SamplingParams):
    """A PROMPT-token request "first", planned and submitted: (its tokens, its events)."""
    tokens = [int(t) for t in np.random.default_rng(seed).integers(20, 3000, PROMPT)]
    plan = engine.manager.plan(PlanRequest("first", np.asarray(tokens, np.int32)))
    events: list = []
    request = GenerationRequest("first", "", tuple(tokens), plan, sampling, 0, 0)
    engine.generator.submit(request, events.append)
    return tokens, events


def test_a_prompt_end_asked_for_mid_decode_keeps_the_prompts_rows_only(tiny_loaded):
    config, loaded = tiny_loaded
    engine = LocalEngine(config, loaded)
    gen, manager = engine.generator, engine.manager
    tokens, events = _submit_first(engine, 7, SamplingParams(max_tokens=DECODED + 40))
    _step_until(engine, lambda: any(a.generated >= DECODED for a in gen.active.values()))

    waiter = np.asarray(tokens + list(range(40, 140)), np.int32)
    wait = manager.plan(PlanRequest("second", waiter, may_wait=True))
    assert wait.after == "first" and wait.after_entry is not None, wait
    told: list = []
    gen.want_prompt_end("first", wait.after_entry, told.append)
    assert told == ["stored"]

    entry = engine.tier.entries[wait.after_entry]
    assert entry.length == PROMPT
    assert layer_caches.entry_length(entry.layers) == PROMPT, "the reply's rows kept too"
    kv = sum(a.nbytes for a in layer_caches.arrays_of(entry.layers))
    assert kv == layer_caches.kv_bytes_per_token(entry.layers) * PROMPT
    assert engine.tier.nbytes == sum(e.nbytes for e in manager.index.entries())

    restoring = manager.plan(PlanRequest("second", waiter, may_wait=True))
    assert not restoring.after and restoring.entry_id == wait.after_entry
    assert restoring.length == PROMPT
    manager.release(Release(request_id="second"))
    _step_until(engine, lambda: any(isinstance(e, Finished) for e in events))
    manager.check_invariants()


class HoldingLink(LocalLink):
    """A LocalLink whose early prompt ends' Orders wait until `deliver()`."""

    def __init__(self, manager):
        super().__init__(manager)
        self.held = []

    def commit_anchor(self, anchor, on_orders) -> None:
        orders = self.manager.commit_anchor(anchor)
        self.held.append(lambda: on_orders(orders))

    def deliver(self) -> None:
        held, self.held = self.held, []
        for fn in held:
            fn()


def test_a_branch_ending_first_does_not_end_the_wait_for_its_requests_prompt_end(tiny_loaded):
    config, loaded = tiny_loaded
    engine = LocalEngine(config, loaded)
    gen, manager = engine.generator, engine.manager
    link = gen.order_ledger.link = HoldingLink(manager)
    tokens, events = _submit_first(engine, 8, SamplingParams(max_tokens=DECODED + 40, n=2))
    _step_until(engine, lambda: any(a.generated >= 2 for a in gen.active.values()))

    waiter = np.asarray(tokens + list(range(40, 140)), np.int32)
    wait = manager.plan(PlanRequest("second", waiter, may_wait=True))
    assert wait.after == "first" and wait.after_entry is not None, wait
    told: list = []
    gen.want_prompt_end("first", wait.after_entry, told.append)
    assert link.held and not told  # stored, its Orders on their way
    gen.cancel("first#1", reason=FinishReason.STOP)  # a stop string in the second branch
    assert not told, "told the request was over while its first branch decodes"
    link.deliver()
    assert told == ["stored"]
    _step_until(engine, lambda: sum(isinstance(e, Finished) for e in events) == 2)
    manager.check_invariants()


def test_a_waiter_that_cannot_be_told_keeps_no_one_else_from_their_answer(tiny_loaded):
    """A waiter's callback that raises (its event loop closed) is not the request's failure:
    the other waiters are told, and the request still gets its final event."""
    config, loaded = tiny_loaded
    engine = LocalEngine(config, loaded)
    gen, manager = engine.generator, engine.manager
    tokens, events = _submit_first(engine, 9, SamplingParams(max_tokens=4))
    waiter = np.asarray(tokens + list(range(40, 140)), np.int32)
    wait = manager.plan(PlanRequest("second", waiter, may_wait=True))
    assert wait.after == "first" and wait.after_entry is not None, wait

    def closed(outcome: str) -> None:
        raise RuntimeError("Event loop is closed")

    told: list = []
    gen.order_ledger.link = HoldingLink(manager)  # the prompt end stays on its way
    gen.want_prompt_end("first", wait.after_entry, closed)
    gen.want_prompt_end("first", wait.after_entry, told.append)
    _step_until(engine, lambda: any(isinstance(e, Finished) for e in events))
    assert told == ["ended"]
    manager.check_invariants()
