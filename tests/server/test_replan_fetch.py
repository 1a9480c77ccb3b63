"""A replanned request whose new restore source a peer holds fetches it first.

With replicas, a lost restore is planned again on the replica that lost it;
when only another replica holds the new source, the plan names `fetch_from`.
`RayCacheLink` must then have the actor fetch the entry (the handover every
first plan gets in `ModelActor.generate`) before the generator sees the new
plan, or the request prefills cold.

- The link's own logic, without a Ray cluster: the loop's inbox and the
  actor's fetch as recorded calls.
- The whole path, with the engine's own replica setup (`replicas=2`) on the
  session's Ray: two ModelActors, the cache-manager actor, the gRPC front end.
  Replica 0 loses a conversation's entry behind the manager's back (a free the
  manager never decided, through the actor's own `apply_orders`: what a stale
  free did before Orders were numbered). The conversation's next turn is
  planned from that entry on replica 0, which reports the restore lost; the
  manager forgets the entry and plans again. With no disk tier, the best
  restore point left is a sibling's divergence checkpoint that only replica 1
  holds: the new plan names `fetch_from=1`, replica 0 fetches the entry before
  the request runs, and the turn is served warm from it, the lost restore
  counted in CacheStats and named in the request's log line.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import pytest

from clients.client import Client
from engine.actors.model import RayCacheLink
from engine.cache.kinds import RestoreKind
from engine.cache.messages import Orders, PlanRequest, Replanned, RestorePlan
from tests.engines import make_config


class Inbox:
    """The model loop's inbox: calls run when `run` says (the loop thread's turn)."""

    def __init__(self):
        self.queued = []

    def call(self, fn) -> None:
        self.queued.append(fn)

    def run(self) -> None:
        while self.queued:
            self.queued.pop(0)(None)


def _replanned(fetch_from):
    plan = RestorePlan("r1", 7, 300, RestoreKind.ENTRY, replica=1, fetch_from=fetch_from)
    return Replanned(plan, Orders())


def test_a_replanned_source_held_by_a_peer_is_fetched_before_the_request_runs():
    link = RayCacheLink(replica=1, deadline=5.0)
    link.loop, fetches, seen = Inbox(), [], []
    link.fetch = lambda plan, then: fetches.append((plan, then))
    answered = link._fetched(seen.append)

    answered(_replanned(fetch_from=0))
    assert [p.entry_id for p, _ in fetches] == [7] and seen == []  # not before the fetch
    fetches[0][1]()  # the handover is over
    link.loop.run()
    assert [r.plan.entry_id for r in seen] == [7]

    for held_here in (None, 1):  # the source is here (or on disk): no fetch
        seen.clear()
        answered(_replanned(fetch_from=held_here))
        assert len(fetches) == 1 and len(seen) == 1
    answered(Replanned(None, Orders()))  # the manager no longer plans it
    assert len(fetches) == 1 and seen[-1].plan is None


# -- the whole path: two replicas, a lost restore, a fetch, a warm turn -----------------------

COMMON, TAIL = 390, 100  # two prompts share 390 tokens: a divergence point (gain >= 256)


def _ids(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 37) % 2900 + 40 for i in range(n)]


@pytest.fixture(scope="module")
def replicated(ray_session, tmp_path_factory, random_model_dir):
    from engine.server.running.background import BackgroundEngine

    # no file to replan to; two replicas of the session's random-weight qwen3_next
    config = make_config(tmp_path_factory.mktemp("replan"), random_model_dir, disk_budget=0)
    config = dataclasses.replace(
        config, server=dataclasses.replace(config.server, replicas=2, exact_cache_figures=True)
    )
    e = BackgroundEngine(config)
    yield e
    e.stop()


def _hold(e, replica: int) -> None:
    """A planned request that never runs, so `replica` looks busy to the router (its queued
    prefill tokens) and the next cold plan goes to the other replica."""
    import ray

    tokens = np.asarray(_ids(9, 2000), np.int32)
    plan = ray.get(e.engine.manager.plan.remote(PlanRequest("hold", tokens)))
    assert plan.replica == replica


def _wait_idle(client, timeout: float = 30.0) -> None:
    """Until no replica has queued prefill tokens (the hold's release has landed)."""
    deadline = time.time() + timeout
    while any(r.get("queued_prefill_tokens", 0) for r in client.cache_stats()["replicas"]):
        assert time.time() < deadline, "the held plan was never released"
        time.sleep(0.02)


def test_a_lost_restore_is_replanned_from_a_peers_entry_and_served_warm(replicated, caplog):
    import ray

    replicas = replicated.engine.replicas
    common = _ids(1, COMMON)
    b = common + _ids(2, TAIL)  # conversation B, on replica 0
    a = common + _ids(3, TAIL)  # its sibling A, on replica 1, with a divergence point at 390
    with Client(replicated.address, timeout=120) as client:
        first = client.generate(prompt_ids=b, max_tokens=3, namespace="n")
        assert first.replica == "0" and first.usage.cached_tokens == 0
        _hold(replicated, 0)
        sibling = client.generate(prompt_ids=a, max_tokens=3, namespace="n")
        ray.get(replicas[0].release.remote("hold"))
        assert sibling.replica == "1" and sibling.usage.cached_tokens == 0
        _wait_idle(client)

        assert ray.get(replicas[0].generator_stats.remote()).entries >= 1
        ray.get(replicas[0].apply_orders.remote(Orders(free=tuple(range(1, 1000)))))
        assert ray.get(replicas[0].generator_stats.remote()).entries == 0  # B's entry is gone
        before = client.cache_stats()

        turn = b + list(first.token_ids) + _ids(4, 20)
        with caplog.at_level(logging.INFO, logger="lineage.request"):
            second = client.generate(prompt_ids=turn, max_tokens=3, namespace="n")
        after = client.cache_stats()

    assert second.replica == "0", "the replan keeps the request where it was planned"
    assert second.restore.kind == "divergence" and second.restore.length == COMMON
    assert second.usage.cached_tokens == COMMON, "served warm from replica 1's entry"
    assert after["restores_lost"] == before.get("restores_lost", 0) + 1
    fetched = after["replicas"][0].get("handovers", 0) - before["replicas"][0].get("handovers", 0)
    assert fetched == 1, "the new source was fetched from replica 1"
    assert ray.get(replicas[0].handover_stats.remote()).fetched == 1
    (line,) = [
        r.getMessage()
        for r in caplog.records
        if r.name == "lineage.request" and f"id={second.request_id} " in r.getMessage()
    ]
    assert " lost=" in line and " lost=- " not in line, line
    assert f"restore=divergence@{COMMON} " in line and f"cached={COMMON} " in line


def _replica_of(caplog, reply) -> str:
    """The replica that served a bridge reply (chat `chatcmpl-ID`, Responses `resp_ID`)."""
    request_id = reply.id.removeprefix("chatcmpl-").removeprefix("resp_")
    (line,) = [
        r.getMessage()
        for r in caplog.records
        if r.name == "lineage.request" and f"id={request_id} " in r.getMessage()
    ]
    return line.split(" replica=")[1].split(" ")[0]


def test_prompt_cache_key_keeps_a_conversation_on_its_replica(replicated, caplog):
    """An agent's `prompt_cache_key` (chat completions, and Responses chained by
    previous_response_id, as the Agents SDK sends it) is the session key: with replica 0
    busier than replica 1, a key's later turns stay on replica 0, where its conversation
    is, while a request without a key goes to replica 1. The request log names the key."""
    import ray

    from tests.clients.bridge.test_bridge import BridgeThread

    def chat(text: str, **key):
        messages = [{"role": "user", "content": text + " a b" * 40}]
        return client.chat.completions.create(
            model="lineage", messages=messages, max_tokens=2, temperature=0, **key
        )

    def respond(text: str, **more):
        return client.responses.create(
            model="lineage", input=text + " c d" * 40, max_output_tokens=2, temperature=0, **more
        )

    bridge = BridgeThread(replicated.address)
    try:
        with (
            bridge.client() as client,
            Client(replicated.address) as engine_client,
            caplog.at_level(logging.INFO, "lineage.request"),
        ):
            first = [
                chat("key one", prompt_cache_key="agent-1"),
                respond("key two", prompt_cache_key="agent-2"),
            ]
            _wait_idle(engine_client)
            _hold(replicated, 0)  # replica 0 is busier: a request without a home goes to 1
            later = [
                chat("another turn", prompt_cache_key="agent-1"),
                respond("again", previous_response_id=first[1].id, prompt_cache_key="agent-2"),
                chat("no key"),
            ]
            ray.get(replicated.engine.replicas[0].release.remote("hold"))
        assert [_replica_of(caplog, r) for r in first] == ["0", "0"]
        assert [_replica_of(caplog, r) for r in later] == ["0", "0", "1"]
        lines = [r.getMessage() for r in caplog.records if r.name == "lineage.request"]
        assert any(" session=agent-1 " in line for line in lines)  # named beside its misses
    finally:
        bridge.stop()
