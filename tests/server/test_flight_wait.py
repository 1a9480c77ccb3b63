"""Through the server: a turn extending one still prefilling waits for that one's prompt end
and restores it, instead of prefilling the shared prefix beside it a second time; the prompt
end is stored early, so the wait does not last through the first one's decode."""

from __future__ import annotations

import threading
import time

import grpc

from engine.proto import engine_pb2, engine_pb2_grpc
from tests.actors.test_inspection import _figures, _scrape, _until
from tests.server.test_server import collect, request


class FirstRequest:
    """A request streamed on a thread of its own: `prefilling` is set at its first progress
    event (or its end), `finals` and `done` (monotonic seconds) once it ends."""

    def __init__(self, stub, prompt_ids: list[int], max_tokens: int):
        self.prefilling, self.finals, self.done = threading.Event(), [], []
        self.thread = threading.Thread(target=self._run, args=(stub, prompt_ids, max_tokens))
        self.thread.start()

    def _run(self, stub, prompt_ids, max_tokens):
        for ev in stub.Generate(request(prompt_ids=prompt_ids, max_tokens=max_tokens), timeout=300):
            kind = ev.WhichOneof("event")
            if kind == "progress":
                self.prefilling.set()
            elif kind == "final":
                self.finals.append(ev.final)
                self.done.append(time.monotonic())
        self.prefilling.set()

    def still_prefilling(self) -> None:
        assert self.prefilling.wait(120), "the first prompt never started prefilling"
        assert not self.finals, "the first prompt ended before the second was sent"


def test_a_turn_extending_one_still_prefilling_restores_its_prompt_end(random_engine, metrics_port):
    channel = grpc.insecure_channel(random_engine.address)
    stub = engine_pb2_grpc.EngineStub(channel)
    first = [(i * 59) % 3500 + 40 for i in range(8000)]
    waits = stub.CacheStats(engine_pb2.CacheStatsRequest()).flight_waits
    running = FirstRequest(stub, first, max_tokens=1)
    try:
        running.still_prefilling()
        extended = first + [(i * 7) % 3000 + 45 for i in range(400)]
        _, _, second = collect(stub, request(prompt_ids=extended, max_tokens=1), timeout=300)
        running.thread.join(300)
        # CacheStats (and so `lineage stats` and the metrics) show the wait.
        waited = stub.CacheStats(engine_pb2.CacheStatsRequest()).flight_waits - waits
    finally:
        running.thread.join(300)
        channel.close()
    assert running.finals, "the first request did not finish"
    guard_slack = random_engine.config.cache.guard_offset
    assert second.usage.cached_tokens >= len(first) - guard_slack, second.usage
    assert waited > 0
    # Ray's Prometheus export shows the same count (a figure that moved, not a zero).
    tag = random_engine.config.server.ray_namespace

    def exported() -> float:
        return _figures(_scrape(metrics_port, tag), "ray_lineage_flight_waits_total")

    total = stub_flight_waits(random_engine)
    assert _until(lambda: exported() == total, deadline=30), (exported(), total)


def stub_flight_waits(engine) -> int:
    """CacheStats' flight_waits of `engine`, on a channel of its own."""
    with grpc.insecure_channel(engine.address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        return stub.CacheStats(engine_pb2.CacheStatsRequest()).flight_waits


def test_a_turn_extending_one_still_decoding_restores_its_prompt_end_before_it_ends(
    random_engine,
):
    """The wait ends at the first's prompt end, stored early while it decodes on: the
    second restores it whole and streams its reply before the first's decode is over."""
    channel = grpc.insecure_channel(random_engine.address)
    stub = engine_pb2_grpc.EngineStub(channel)
    first = [(i * 61) % 3500 + 41 for i in range(8000)]
    running = FirstRequest(stub, first, max_tokens=1500)
    try:
        running.still_prefilling()
        extended = first + [(i * 11) % 3000 + 47 for i in range(300)]
        _, _, second = collect(stub, request(prompt_ids=extended, max_tokens=4), timeout=300)
        second_done = time.monotonic()
        running.thread.join(300)
    finally:
        channel.close()
    finals = running.finals
    assert finals, "the first request did not finish"
    assert finals[0].usage.completion_tokens > 200, finals[0].usage  # a long decode
    assert second.usage.cached_tokens == len(first), second.usage
    assert second_done < running.done[0], "the second waited for the first's whole decode"
