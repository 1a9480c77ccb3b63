"""Supervision end to end: real processes killed with SIGKILL, a real wedged loop.

One engine serves the module: the model actor's process is killed mid-stream,
then the cache manager's, then the model loop is wedged. After each, a
request is served within 30 s, warm from the disk tier, and the supervisor
has begun a new epoch.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from clients.client import Client, LineageError
from clients.fanout import make_shared_prefix, user_message

SYSTEM, TOOLS = make_shared_prefix(600, seed=5)
RECOVERY_S = 30.0


@pytest.fixture(scope="module")
def engine(ray_session, tmp_path_factory, model_cache_dir):
    from engine.server.running.background import BackgroundEngine
    from tests.engines import make_config

    config = make_config(tmp_path_factory.mktemp("supervised")).with_server(
        loop_deadline=2.0, call_deadline=20.0
    )
    # The embedded model is built once per session, in model_cache_dir.
    config = config.with_model(path=_model_dir(model_cache_dir))
    e = BackgroundEngine(config)
    yield e
    e.stop()


def _model_dir(model_cache_dir) -> str:
    from engine.runtime.model.tiny_models import ensure_default_model

    return str(ensure_default_model(model_cache_dir))


@pytest.fixture(scope="module")
def client(engine):
    with Client(engine.address, timeout=60) as c:
        yield c


def convo(*users):
    return [{"role": "system", "content": SYSTEM}] + [{"role": "user", "content": u} for u in users]


def chat(client, messages, ns, max_tokens=6):
    return client.generate(messages=messages, tools=TOOLS, max_tokens=max_tokens, namespace=ns)


def warm_turn_one(engine, client, ns):
    """Turn one served and its files on disk; the messages of turn two."""
    import ray

    msgs = convo(user_message(7, 0))
    r1 = chat(client, msgs, ns)
    assert ray.get(engine.engine.model.flush_disk.remote(60), timeout=70)
    return msgs + [
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": user_message(7, 1)},
    ], r1


def pid_of(actor) -> int:
    import ray

    return ray.get(actor.hello.remote(), timeout=30).pid


def served_warm_after(client, msgs, ns, r1, since: float):
    """Turn two is served within RECOVERY_S of `since`, restoring turn one from disk."""
    while True:
        try:
            r2 = chat(client, msgs, ns)
            break
        except LineageError as e:  # UNAVAILABLE while the actor restarts
            assert e.code == "UNAVAILABLE", e
            assert time.monotonic() - since < RECOVERY_S, "not served within 30 s"
            time.sleep(0.2)
    took = time.monotonic() - since
    assert took < RECOVERY_S, took
    assert r2.usage.cached_tokens >= r1.usage.prompt_tokens, r2.usage
    return r2


def kill_mid_stream(engine, client, actor):
    """A stream is live; SIGKILL the actor's process; the stream ends UNAVAILABLE."""
    pid = pid_of(actor)
    stream = client.stream(prompt_ids=list(range(50, 90)), max_tokens=30000)
    next(stream)
    epoch = engine.engine.supervisor.epoch
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(LineageError) as err:
        stream.result()
    assert err.value.code == "UNAVAILABLE", err.value
    return killed, epoch


def test_kill_9_of_the_model_actor_mid_stream_then_served_warm(engine, client):
    """Also: a file the dead process's writer had queued, never written, leaves the disk
    index when the replica is revived, so the index equals the directory."""
    import ray

    ns = "kill-model"
    msgs, r1 = warm_turn_one(engine, client, ns)
    ray.get(engine.engine.model.__ray_call__.remote(_block_writes), timeout=30)
    chat(client, convo(user_message(8, 0)), "kill-model-unwritten")  # its file stays queued
    before = client.cache_stats()
    killed, epoch = kill_mid_stream(engine, client, engine.engine.model)
    r2 = served_warm_after(client, msgs, ns, r1, killed)
    assert r2.restore.kind != "none"
    assert engine.engine.supervisor.epoch > epoch
    indexed, on_disk = ray.get(engine.engine.manager.__ray_call__.remote(_index_and_files))
    assert indexed == on_disk, (indexed, on_disk)
    after = client.cache_stats()
    assert after["disk_writes_lost"] > before["disk_writes_lost"]
    assert after["restores_lost"] == before["restores_lost"], "restored from a missing file"


def test_kill_9_of_the_cache_manager_mid_stream_then_served_warm(engine, client):
    ns = "kill-manager"
    msgs, r1 = warm_turn_one(engine, client, ns)
    killed, epoch = kill_mid_stream(engine, client, engine.engine.manager)
    served_warm_after(client, msgs, ns, r1, killed)
    assert engine.engine.supervisor.epoch > epoch
    stats = client.cache_stats()  # the rebuilt index came from the disk tier
    assert stats["disk_entries"] >= 1


def test_cache_stats_while_the_cache_manager_restarts_are_unavailable_with_why(engine, client):
    """The operator's figures asked for while the cache manager restarts: UNAVAILABLE naming
    the cache manager (never UNKNOWN from an error the servicer let through), then served."""
    pid = pid_of(engine.engine.manager)
    os.kill(pid, signal.SIGKILL)
    refused, deadline = [], time.monotonic() + RECOVERY_S
    while True:
        try:
            client.cache_stats()
            break
        except LineageError as e:
            refused.append((e.code, str(e)))
            assert time.monotonic() < deadline, refused[-3:]
            time.sleep(0.05)
    # Ray may retry the read across the restart (then the answer waits for the new manager
    # and nothing is refused); whatever is refused must be UNAVAILABLE naming the manager,
    # never UNKNOWN from an error the servicer let through.
    assert pid_of(engine.engine.manager) != pid
    assert all(code == "UNAVAILABLE" and "cache manager" in why for code, why in refused), refused


def test_a_replica_that_misses_one_ping_is_reset_and_holds_only_what_is_placed(engine, client):
    """A loop stalled past --loop-deadline once (not twice: it is not killed) is reported
    lost, then answers: it is reset like a restarted replica (its old tier emptied, a new
    epoch), and afterwards its tier holds exactly what the manager places there and every
    file the disk index holds is on disk."""
    import ray

    from clients.bench.faults.checks import Holdings, compare, entry_files, read_holdings
    from engine.storage.file_format import entries_dir

    ns, sup = "missed-ping", engine.engine.supervisor
    model, manager = engine.engine.model, engine.engine.manager
    r1 = chat(client, convo(user_message(20, 0)), ns)
    before = ray.get(model.__ray_call__.remote(read_holdings), timeout=30)["entries"]
    assert before
    restarts, wedged = sup.restarts, sup.wedged_restarts
    # A stall of 1.5 x the 2 s deadline makes a ping miss only when a round's ping reaches
    # the loop within the stall's first second; rounds are a second or more apart, and
    # further apart on a loaded machine, so the stall is repeated until one is missed.
    # Between stalls the loop answers many rounds: never two misses in a row.
    # Once the miss is seen (the manager stops routing to the replica), the reset is waited
    # for however long it takes: a new stall then would lose the replica a second time.
    for _ in range(4):
        ray.get(model.__ray_call__.remote(_stall, 3.0), timeout=30)
        stalled, missed = time.monotonic(), False
        while sup.restarts == restarts:
            missed = missed or 0 not in ray.get(manager.alive.remote(), timeout=30)
            if time.monotonic() - stalled > (RECOVERY_S if missed else RECOVERY_S / 3):
                break
            time.sleep(0.2)
        if sup.restarts != restarts or missed:
            break
    assert sup.restarts != restarts, "the replica was never reset"
    assert sup.wedged_restarts == wedged, "one missed ping: reset, not killed"
    after = ray.get(model.__ray_call__.remote(read_holdings), timeout=30)["entries"]
    assert not set(after) & set(before), "the tier kept what the manager forgot"
    msgs = convo(user_message(20, 0)) + [
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": user_message(20, 1)},
    ]
    served_warm_after(client, msgs, ns, r1, time.monotonic())  # from the entry's file
    assert ray.get(model.flush_disk.remote(60), timeout=70)
    held = ray.get(model.__ray_call__.remote(read_holdings), timeout=30)
    audit = ray.get(manager.audit.remote(), timeout=30)
    files = entry_files(entries_dir(engine.config.cache.cache_dir))
    found = compare(audit, [Holdings(0, **held)], files)
    assert not found, found


def _stall(actor, seconds: float) -> None:
    actor.loop.call(lambda g: time.sleep(seconds))


def test_a_wedged_loop_goes_not_serving_and_the_actor_restarts(engine, client):
    """The loop thread sleeps; health turns NOT_SERVING, the actor is restarted, and a
    request sent into the wedged loop (it streamed nothing) is run again and served."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    import ray
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = grpc.insecure_channel(engine.address)
    health = health_pb2_grpc.HealthStub(channel)
    sup = engine.engine.supervisor
    restarts, retries = sup.wedged_restarts, engine.engine.frontend.retries
    ray.get(engine.engine.model.__ray_call__.remote(_wedge), timeout=30)
    wedged = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.generate, prompt_ids=[9, 8, 7, 6, 5], max_tokens=4)
        seen_not_serving = False
        while time.monotonic() - wedged < RECOVERY_S:
            status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
            seen_not_serving |= status == health_pb2.HealthCheckResponse.NOT_SERVING
            if seen_not_serving and status == health_pb2.HealthCheckResponse.SERVING:
                break
            time.sleep(0.2)
        assert seen_not_serving
        result = pending.result(timeout=RECOVERY_S)
    channel.close()
    assert result.usage.completion_tokens >= 1
    assert sup.wedged_restarts == restarts + 1
    assert engine.engine.frontend.retries == retries + 1


def _block_writes(actor) -> None:
    """From now on the disk writer of this process never finishes a write."""
    import threading

    from engine.storage import writer

    never = threading.Event()
    writer.write_file = lambda directory, job: never.wait()


def _index_and_files(actor) -> tuple[list, list]:
    """The manager's disk index and the entry files in its directory."""
    files = sorted(int(p.stem) for p in actor.directory.path.glob("*.entry"))
    return sorted(actor.manager.disk_index.files), files


def _wedge(actor) -> None:
    actor.loop.call(lambda g: time.sleep(3600))
