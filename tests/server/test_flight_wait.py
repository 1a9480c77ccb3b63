"""Through the server: a turn extending one still prefilling waits for that one's commit and
restores its prompt end, instead of prefilling the shared prefix beside it a second time."""

from __future__ import annotations

import threading

import grpc

from engine.proto import engine_pb2, engine_pb2_grpc
from tests.server.test_server import collect, request


def test_a_turn_extending_one_still_prefilling_restores_its_prompt_end(random_engine):
    channel = grpc.insecure_channel(random_engine.address)
    stub = engine_pb2_grpc.EngineStub(channel)
    first = [(i * 59) % 3500 + 40 for i in range(8000)]
    prefilling = threading.Event()
    finals = []
    waits = stub.CacheStats(engine_pb2.CacheStatsRequest()).flight_waits

    def first_request():
        for ev in stub.Generate(request(prompt_ids=first, max_tokens=1), timeout=300):
            kind = ev.WhichOneof("event")
            if kind == "progress":
                prefilling.set()
            elif kind == "final":
                finals.append(ev.final)
        prefilling.set()

    thread = threading.Thread(target=first_request)
    thread.start()
    try:
        assert prefilling.wait(120), "the first prompt never started prefilling"
        assert not finals, "the first prompt ended before the second was sent"
        extended = first + [(i * 7) % 3000 + 45 for i in range(400)]
        _, _, second = collect(stub, request(prompt_ids=extended, max_tokens=1), timeout=300)
        thread.join(300)
        # CacheStats (and so `lineage stats` and the metrics) show the wait.
        waited = stub.CacheStats(engine_pb2.CacheStatsRequest()).flight_waits - waits
    finally:
        thread.join(300)
        channel.close()
    assert finals, "the first request did not finish"
    guard_slack = random_engine.config.cache.guard_offset
    assert second.usage.cached_tokens >= len(first) - guard_slack, second.usage
    assert waited > 0
