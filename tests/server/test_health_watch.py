"""Health checks never take the engine's request slots.

`Health/Watch` streams never end on their own, and gRPC's own cap on calls at
once counted them: 320 watchers (max-queue + 64) and every Generate was
RESOURCE_EXHAUSTED. Now `Check` stays open, `Watch` needs a token when tokens
are on, watchers are capped and end after a while, and only Engine calls
count against the slots. Real gRPC servers; the first test on the session's
engine (Ray, MLX).
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.client import Client, LineageError
from engine.cache.kinds import RestoreKind
from engine.config import Identity, Limits, ServerConfig
from engine.runtime.events import Finished, FinishReason
from engine.server.rpc.service import create_server
from engine.server.running.background import BackgroundLoop
from tests.server.test_auth import serving

WATCH = health_pb2.HealthCheckRequest(service="")


def open_watches(address: str, count: int, channels: int = 8, metadata=()):
    """`count` Watch streams over a few channels: (streams that answered, refusals by code)."""
    chans = [grpc.insecure_channel(address) for _ in range(channels)]
    stubs = [health_pb2_grpc.HealthStub(c) for c in chans]
    answered, refused = [], {}
    for i in range(count):
        call = stubs[i % channels].Watch(WATCH, metadata=metadata)
        try:
            next(call)
            answered.append(call)
        except grpc.RpcError as e:
            refused[e.code().name] = refused.get(e.code().name, 0) + 1
    return chans, answered, refused


def close_all(chans, calls) -> None:
    for call in calls:
        call.cancel()
    for c in chans:
        c.close()


def test_watch_streams_cannot_take_the_request_slots(engine):
    slots = engine.config.model.max_queue + 64  # what gRPC's own cap was
    chans, watching, refused = open_watches(engine.address, slots + 10)
    try:
        with Client(engine.address, timeout=120) as c:
            result = c.generate(prompt_ids=[5, 6, 7], max_tokens=2)  # refused before: no slot
        assert result.usage.completion_tokens >= 1
        assert len(watching) <= ServerConfig().health_watchers, len(watching)
        assert set(refused) <= {"RESOURCE_EXHAUSTED"}, refused
    finally:
        close_all(chans, watching)


def test_watch_needs_a_token_and_check_stays_open():
    tokens = (Identity("op-token", "", admin=True),)
    with serving(tokens=tokens) as address:
        chans, watching, refused = open_watches(address, 2, channels=1)
        close_all(chans, watching)
        assert refused == {"UNAUTHENTICATED": 2}
        auth = (("authorization", "Bearer op-token"),)
        chans, watching, refused = open_watches(address, 2, channels=1, metadata=auth)
        close_all(chans, watching)
        assert len(watching) == 2 and not refused
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(WATCH, timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_watchers_are_capped_end_after_a_while_and_leave_the_slots_alone():
    with serving(health_watchers=3, health_watch_seconds=1.0, max_concurrent_rpcs=2) as address:
        chans, watching, refused = open_watches(address, 5, channels=2)
        try:
            assert len(watching) == 3 and refused == {"RESOURCE_EXHAUSTED": 2}
            with Client(address, timeout=10) as c:  # two slots, three watchers: still served
                assert c.model_info()["model"] == "m"
            t0 = time.monotonic()
            for call in watching:  # each ends, OK, after health_watch_seconds
                assert list(call) == []
                assert call.code() == grpc.StatusCode.OK
            assert time.monotonic() - t0 < 10
        finally:
            close_all(chans, watching)
        chans, again, refused = open_watches(address, 3, channels=1)  # their places are free
        close_all(chans, again)
        assert len(again) == 3 and not refused


class HeldFrontend(SimpleNamespace):
    """Stands for the engine: each Generate waits until `release` is set."""

    def __init__(self):
        super().__init__(
            info=SimpleNamespace(vocab_size=1000), cache_mode="lineage", limits=Limits()
        )
        self.release = threading.Event()
        self.closing = asyncio.Event()

    async def generate(self, inp, sampling, namespace="", request_id="", session="", grammar=None):
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        yield [Finished(request_id, FinishReason.STOP, 1, 0, 0, RestoreKind.NONE, 0)]

    def error(self, code: str) -> None:
        pass


def test_engine_calls_past_the_slots_are_resource_exhausted():
    """The cap on Engine calls at once still holds, and health answers beside them."""
    loop, frontend = BackgroundLoop("slots-test"), HeldFrontend()
    server, port, _ = loop.call(
        create_server(frontend, "127.0.0.1", 0, security=ServerConfig(), max_concurrent_rpcs=1)
    )
    address = f"127.0.0.1:{port}"
    try:
        with Client(address, timeout=10) as c:
            held = c.stream(prompt_ids=[1, 2], max_tokens=1)
            time.sleep(0.5)  # the held call takes the one slot
            with pytest.raises(LineageError) as err:
                c.generate(prompt_ids=[1, 2], max_tokens=1)
            assert err.value.code == "RESOURCE_EXHAUSTED"
            with grpc.insecure_channel(address) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(WATCH, timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            frontend.release.set()
            assert held.result().finish_reason == "stop"
            assert c.generate(prompt_ids=[1, 2], max_tokens=1).finish_reason == "stop"
    finally:
        frontend.release.set()
        loop.call(server.stop(0))
        loop.close()
