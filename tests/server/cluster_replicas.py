"""Two model replicas on a two-node Ray cluster (ray.cluster_utils.Cluster) on this machine.

Each node has {"mlx": 1} and 1 CPU, so `--replicas auto` puts one replica on
each. The cluster is tests/server/cluster.py's, a plugin of the pytest process of
its own that tests/server/test_replicas.py runs: the cluster's driver cannot share
a process with the session's Ray.

- a session's later turns go to the replica holding its entry;
- a new session on the second replica restores the shared system prompt's
  anchor handed over from the first (restore kind anchor);
- a replica saturated with long prefills sheds new sessions to the other;
- a session key keeps its conversation's turns on its replica when nothing
  cached says where they belong, and the same key from another tenant does not;
- a replica killed mid-stream: the stream ends UNAVAILABLE, the session's next
  turn is served warm elsewhere, health stays SERVING, the replica comes back.
"""

from __future__ import annotations

import itertools
import threading
import time

import grpc
import pytest

from clients.client import Client, LineageError
from clients.fanout import make_shared_prefix, user_message
from clients.wire import Chunk, Final, Progress
from engine.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig

SYSTEM, TOOLS = make_shared_prefix(900, seed=5)
THRESHOLD = 256  # queued prefill tokens: a long prompt in prefill saturates a replica
_ns = itertools.count()


@pytest.fixture(scope="module")
def engine(cluster, tmp_path_factory):
    from engine.runtime.model.tiny_models import write_model_dir
    from engine.server.running.background import BackgroundEngine

    # A random-weight qwen3_next: routing and handover need a hybrid model, not the
    # trained one's predictions, and its prefill is the faster one on a CPU.
    model = write_model_dir("qwen3_next", tmp_path_factory.mktemp("random-qwen3_next"))
    config = EngineConfig(
        model=ModelConfig(path=str(model), max_batch=8, prefill_step_size=128),
        cache=CacheConfig(cache_dir=str(tmp_path_factory.mktemp("replicas")), ram_budget=2 << 30),
        server=ServerConfig(port=0, replicas="auto", route_threshold=THRESHOLD),
    )
    e = BackgroundEngine(config)
    yield e
    e.stop()


@pytest.fixture(scope="module")
def client(engine):
    with Client(engine.address, timeout=120) as c:
        yield c


def convo(*users, system=SYSTEM):
    return [{"role": "system", "content": system}] + [{"role": "user", "content": u} for u in users]


def chat(client, messages, ns, max_tokens=4):
    return client.generate(messages=messages, tools=TOOLS, max_tokens=max_tokens, namespace=ns)


def requests_by_replica(client) -> list[int]:
    return [r["requests"] for r in client.cache_stats()["replicas"]]


def routed(client, before: list[int]) -> int:
    """The one replica whose request count grew since `before`."""
    grew = [r for r, (a, b) in enumerate(zip(before, requests_by_replica(client))) if b > a]
    assert len(grew) == 1, grew
    return grew[0]


def test_one_replica_per_mlx_resource(engine, client):
    import ray

    stats = client.cache_stats()
    assert [r["alive"] for r in stats["replicas"]] == [True, True]
    nodes = set(ray.get([m.node.remote() for m in engine.engine.replicas]))
    assert len(nodes) == 2, "each replica on a node of its own"


def test_later_turns_go_to_the_holding_replica(client):
    ns = f"turns-{next(_ns)}"
    msgs = convo(user_message(0, 0))
    before = requests_by_replica(client)
    r1 = chat(client, msgs, ns)
    home = routed(client, before)
    for turn in (1, 2):
        msgs = msgs + [
            {"role": "assistant", "content": r1.text},
            {"role": "user", "content": user_message(0, turn)},
        ]
        before = requests_by_replica(client)
        r1 = chat(client, msgs, ns)
        assert routed(client, before) == home
        assert r1.restore.kind in ("entry", "reply") and r1.usage.cached_tokens > 0


def _long_prompt(seed: int) -> list:
    """A first turn with a long user message: seconds of prefill on one CPU."""
    words = " ".join(f"w{seed}x{i}" for i in range(600))
    return convo(f"Summarize: {words}")


def _saturate(client, ns: str, seeds) -> list[threading.Thread]:
    """Long prefills in `ns` (same system prompt: they go to its anchor's holder)."""
    threads = [
        threading.Thread(target=chat, args=(client, _long_prompt(s), ns), daemon=True)
        for s in seeds
    ]
    for t in threads:
        t.start()
    return threads


def _wait_queued(client, minimum: int, timeout: float = 30.0) -> int:
    """The replica with at least `minimum` queued prefill tokens."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for r in client.cache_stats()["replicas"]:
            if r["queued_prefill_tokens"] >= minimum:
                return r["replica"]
        time.sleep(0.02)
    raise AssertionError("no replica got saturated")


def test_new_session_restores_the_anchor_handed_over_from_the_other_replica(client):
    ns = f"handover-{next(_ns)}"
    first = chat(client, convo(user_message(1, 0)), ns)
    assert first.restore.kind == "none"
    threads = _saturate(client, ns, [1])  # the anchor's holder gets busy
    busy = _wait_queued(client, THRESHOLD * 2)
    before = client.cache_stats()["replicas"]
    second = chat(client, convo("A different first question about parsers."), ns)
    after = client.cache_stats()["replicas"]
    for t in threads:
        t.join(120)
    other = 1 - busy
    assert after[other]["requests"] == before[other]["requests"] + 1
    assert second.restore.kind == "anchor"
    assert second.usage.cached_tokens >= first.usage.prompt_tokens - 60
    assert after[other]["handovers"] == before[other]["handovers"] + 1
    assert after[other]["handover_bytes"] > 0


def test_saturated_replica_sheds_new_sessions(client):
    ns = f"shed-{next(_ns)}"
    chat(client, convo(user_message(2, 0)), ns)
    threads = _saturate(client, ns, [2])
    busy = _wait_queued(client, THRESHOLD * 2)
    before = requests_by_replica(client)
    for i in range(3):
        chat(client, convo(f"New session {i} with its own question.", system=f"Other {i}."), ns)
    after = requests_by_replica(client)
    for t in threads:
        t.join(120)
    assert after[1 - busy] - before[1 - busy] == 3
    assert after[busy] == before[busy]


def test_a_session_key_keeps_its_conversation_on_its_replica(client):
    ns = f"session-{next(_ns)}"

    def turn(minute: int, namespace: str = ns) -> int:
        # A time on the system prompt's first line: no restore point anywhere for it.
        messages = [
            {"role": "system", "content": f"Time: 10:0{minute}.\nYou are a careful agent."},
            {"role": "user", "content": "What does setup.py do?"},
        ]
        before = requests_by_replica(client)
        client.generate(messages=messages, max_tokens=2, namespace=namespace, session="agent-1")
        return routed(client, before)

    threads = _saturate(client, f"{ns}-load", [4])  # idle replicas: it goes to replica 0
    busy = _wait_queued(client, THRESHOLD * 2)
    home = turn(0)
    for t in threads:
        t.join(120)
    assert (busy, home) == (0, 1)
    # Idle again: without its key a turn goes to replica 0 (the tie); with it, home.
    assert [turn(m) for m in (1, 2)] == [home, home]
    assert client.cache_stats()["replicas"][home]["sessions"] >= 1
    # The same key from another tenant is a session of its own: not steered home.
    assert turn(3, namespace=f"{ns}-other") == 0


def test_replica_killed_mid_stream(engine, client):
    import ray
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    ns = f"kill-{next(_ns)}"
    msgs = convo(user_message(3, 0))
    before = requests_by_replica(client)
    r1 = chat(client, msgs, ns)
    home = routed(client, before)
    model = engine.engine.replicas[home]
    assert ray.get(model.flush_disk.remote(60), timeout=90)  # the entry's file is written
    msgs = msgs + [
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": user_message(3, 1)},
    ]
    stream = client.stream(messages=msgs, tools=TOOLS, max_tokens=4000, namespace=ns)
    events = iter(stream)
    while not isinstance(next(events), Chunk):  # until tokens stream from `home`
        pass
    ray.kill(model, no_restart=False)
    with pytest.raises(LineageError) as err:
        for _ in events:
            pass
    assert err.value.code == "UNAVAILABLE"
    with grpc.insecure_channel(engine.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        status = health.Check(health_pb2.HealthCheckRequest(service="")).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    # the other replica hands a file of this machine over without keeping it in RAM
    from engine.storage.file_format import SUFFIX, entries_dir

    files = sorted(entries_dir(engine.config.cache.cache_dir).glob(f"*{SUFFIX}"))
    entry_id = int(files[-1].stem)
    other = engine.engine.replicas[1 - home]
    portable = ray.get(other.export_entry.remote(entry_id, 0.0, True), timeout=60)
    assert portable is not None and portable.length > 0 and portable.nbytes > 0
    assert ray.get(other.export_entry.remote(entry_id), timeout=60) is None  # not in its RAM
    r2 = chat(client, msgs, ns)
    # The supervisor may have `home` back already (resynchronised, empty): either replica
    # serves the next turn, warm from the entry's file.
    assert r2.usage.cached_tokens >= r1.usage.prompt_tokens
    _wait_back(client, model, home)


def _wait_back(client, model, replica: int) -> None:
    import ray

    deadline = time.time() + 60
    while not client.cache_stats()["replicas"][replica]["alive"]:
        assert time.time() < deadline, "the killed replica did not come back"
        time.sleep(0.2)
    assert ray.get(model.attached.remote(), timeout=30)


def test_request_that_streamed_nothing_is_retried_on_the_other_replica(engine, client):
    import ray

    ns = f"retry-{next(_ns)}"
    before = requests_by_replica(client)
    stream = client.stream(messages=_long_prompt(9), tools=TOOLS, max_tokens=4, namespace=ns)
    events = iter(stream)
    assert isinstance(next(events), Progress)  # in prefill: nothing streamed yet
    first = routed(client, before)
    model = engine.engine.replicas[first]
    ray.kill(model, no_restart=False)
    rest = list(events)
    assert isinstance(rest[-1], Final) and rest[-1].usage.completion_tokens == 4
    after = requests_by_replica(client)
    assert after[1 - first] == before[1 - first] + 1
    _wait_back(client, model, first)
