"""Deadlines and token admission end to end: real gRPC, Ray actors and MLX.

Each call past its deadline ends with a clear status (UNAVAILABLE past a deadline,
RESOURCE_EXHAUSTED past the token budget, an empty answer past the link's) and leaves
nothing behind: its queue slot, its request id, its batch slot, its plan's pin
at the cache manager. The session's engine is shared: a test shortens one
deadline or limit of its front end, and puts it back.
"""

from __future__ import annotations

import queue
import time

import grpc
import pytest

from engine.proto import engine_pb2
from tests.server.test_server import collect, request

pb = engine_pb2
PROMPT = [(i * 13) % 2500 + 30 for i in range(120)]


def _manager_holds(engine) -> tuple[int, int]:
    """(requests in flight, restore pins) at the cache manager, its invariants checked."""
    import ray

    def held(actor):
        actor.manager.check_invariants()
        return len(actor.manager.flights), len(actor.manager.index.pins)

    return ray.get(engine.engine.manager.__ray_call__.remote(held), timeout=60)


def _nothing_left(engine, timeout: float = 30.0) -> None:
    """Every trace of the requests so far is gone: front end, model actor, manager."""
    frontend = engine.engine.frontend
    deadline = time.monotonic() + timeout
    while True:
        tier = engine.generator_stats()
        left = (frontend.queued, len(frontend.flight.request_ids), tier.active, tier.pending)
        if left == (0, 0, 0, 0) and _manager_holds(engine) == (0, 0):
            return
        assert time.monotonic() < deadline, (left, _manager_holds(engine))
        time.sleep(0.2)


def _sleep_in(actor_call, seconds: float) -> None:
    """Keep an actor busy for `seconds` (a sync actor: its next calls wait behind it)."""
    actor_call.remote(lambda actor: time.sleep(seconds))


def test_a_request_that_alone_needs_more_than_the_token_budget_is_resource_exhausted(engine, stub):
    frontend = engine.engine.frontend
    saved = frontend.max_batch_tokens
    frontend.max_batch_tokens = 64
    try:
        witness = stub.Generate(request(prompt_ids=PROMPT[:8], max_tokens=20), timeout=120)
        with pytest.raises(grpc.RpcError) as err:
            collect(stub, request(prompt_ids=PROMPT[:40], max_tokens=40))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
        assert "--max-batch-tokens" in err.value.details()
        finals = [e.final for e in witness if e.WhichOneof("event") == "final"]
    finally:
        frontend.max_batch_tokens = saved
    assert finals and finals[0].finish_reason in ("length", "stop")
    _nothing_left(engine)


def test_a_silent_stream_past_its_deadline_is_unavailable_and_frees_its_slot(engine, stub):
    """The model loop is busy for 4 s; the stream's deadline is 1 s."""
    import ray

    frontend = engine.engine.frontend
    saved = frontend.stream_deadline
    frontend.stream_deadline = 1.0
    try:
        ray.get(
            engine.engine.model.__ray_call__.remote(lambda a: a.loop.call(lambda g: time.sleep(4)))
        )
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            collect(stub, request(prompt_ids=PROMPT[:30], max_tokens=4))
        took = time.monotonic() - t0
    finally:
        frontend.stream_deadline = saved
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
    assert "sent nothing for" in err.value.details()
    assert took < 3.5, f"the stream deadline was not kept: {took:.1f} s"
    _nothing_left(engine)
    ids, _, _ = collect(stub, request(prompt_ids=PROMPT[:30], max_tokens=2))  # served again
    assert ids


def test_a_plan_past_the_call_deadline_is_unavailable_and_its_pin_is_released(engine, stub):
    """The cache manager is busy for 4 s; the front end's call deadline is 1 s. The plan
    made after that pins an entry; the model actor releases it."""
    collect(stub, request(prompt_ids=PROMPT, max_tokens=2))  # an entry to restore from
    frontend = engine.engine.frontend
    saved = frontend.deadline
    frontend.deadline = 1.0
    try:
        _sleep_in(engine.engine.manager.__ray_call__, 4.0)
        with pytest.raises(grpc.RpcError) as err:
            collect(stub, request(prompt_ids=PROMPT + [5, 6, 7], max_tokens=2))
    finally:
        frontend.deadline = saved
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
    assert "did not plan within" in err.value.details()
    _nothing_left(engine)
    _, _, final = collect(stub, request(prompt_ids=PROMPT + [5, 6, 7], max_tokens=2))
    assert final.usage.cached_tokens >= len(PROMPT) - 64, "the entry was lost with the pin"


class _Inbox:
    """ModelLoop.call's contract, drained on the test's thread: fn(generator) in order."""

    def __init__(self):
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.applied: list = []

    def call(self, fn) -> None:
        self.calls.put(fn)

    def next(self, timeout: float):
        fn = self.calls.get(timeout=timeout)
        fn(self)  # a late answer calls g.apply_unasked(orders): this inbox plays the generator

    def apply_unasked(self, orders) -> None:
        self.applied.append(orders)


def test_a_manager_call_past_the_link_deadline_is_answered_empty_and_applied_late(
    ray_session,
):
    """RayCacheLink: no answer within its deadline -> empty Orders for the waiting request;
    the late answer's Orders (frees) are still applied; an answer of an old epoch is not."""
    import numpy as np
    import ray

    from engine.actors.model import RayCacheLink
    from engine.cache.messages import Commit, Orders

    @ray.remote(num_cpus=0)
    class SlowManager:
        def commit(self, commit, replica):
            time.sleep(2.0)
            return Orders(free=(41,))

    link = RayCacheLink(replica=0, deadline=0.5)
    link.loop, link.manager, link.epoch = _Inbox(), SlowManager.remote(), 3
    answers = []
    commit = Commit("late", "", 1, np.arange(4, dtype=np.int32), 4, None, 0, (), 1, 1)
    t0 = time.monotonic()
    link.commit(commit, answers.append)
    link.loop.next(timeout=10)
    assert answers == [Orders()] and time.monotonic() - t0 < 1.5, "not answered at the deadline"
    link.loop.next(timeout=10)  # the real answer, 2 s on
    assert link.loop.applied == [Orders(free=(41,))]

    link.commit(commit, answers.append)
    link.epoch = 4  # the manager restarted meanwhile: its answers no longer apply
    link.loop.next(timeout=10)
    assert answers[-1] == Orders()
    with pytest.raises(queue.Empty):
        link.loop.next(timeout=3)
    assert len(link.loop.applied) == 1
