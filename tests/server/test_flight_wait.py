"""Through the server: a turn extending one still prefilling waits for that one's prompt end
and restores it, instead of prefilling the shared prefix beside it a second time; the prompt
end is stored early, so the wait does not last through the first one's decode."""

from __future__ import annotations

import threading
import time

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


def test_a_turn_extending_one_still_decoding_restores_its_prompt_end_before_it_ends(
    random_engine,
):
    """The wait ends at the first's prompt end, stored early while it decodes on: the
    second restores it whole and streams its reply before the first's decode is over."""
    channel = grpc.insecure_channel(random_engine.address)
    stub = engine_pb2_grpc.EngineStub(channel)
    first = [(i * 61) % 3500 + 41 for i in range(8000)]
    prefilling = threading.Event()
    finals, first_done = [], []

    def first_request():
        long_decode = request(prompt_ids=first, max_tokens=1500)
        for ev in stub.Generate(long_decode, timeout=300):
            kind = ev.WhichOneof("event")
            if kind == "progress":
                prefilling.set()
            elif kind == "final":
                finals.append(ev.final)
                first_done.append(time.monotonic())
        prefilling.set()

    thread = threading.Thread(target=first_request)
    thread.start()
    try:
        assert prefilling.wait(120), "the first prompt never started prefilling"
        assert not finals, "the first prompt ended before the second was sent"
        extended = first + [(i * 11) % 3000 + 47 for i in range(300)]
        _, _, second = collect(stub, request(prompt_ids=extended, max_tokens=4), timeout=300)
        second_done = time.monotonic()
        thread.join(300)
    finally:
        channel.close()
    assert finals, "the first request did not finish"
    assert finals[0].usage.completion_tokens > 200, finals[0].usage  # a long decode
    assert second.usage.cached_tokens == len(first), second.usage
    assert second_done < first_done[0], "the second waited for the first's whole decode"
