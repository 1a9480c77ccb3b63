"""The prefill log (engine.runtime.batching.prefill_log), pure: a request's time split from
its chunks, and the chunk cost fit; its rings of the newest rows and chunks, reported as the
deques were, and allocated up front. Times are injected."""

from __future__ import annotations

import random
import tracemalloc
from collections import deque

import pytest

from engine.runtime.batching import prefill_log, ring
from engine.runtime.batching.prefill_log import ChunkRecord, PrefillLog, fixed_cost


def test_a_requests_row_splits_its_time_into_queued_waiting_chunks_and_between():
    log = PrefillLog()
    log.chunk([7], start=10.0, seconds=0.2, tokens=100, context=0)
    log.chunk([9], start=10.2, seconds=0.1, tokens=10, context=0)  # another's, between
    log.chunk([7, 8], start=10.5, seconds=0.3, tokens=50, context=100)
    log.request_row(log.take(7), received=9.0, admitted=9.5, request_id="r", namespace="cold")
    row = log.report()["requests"][0]
    assert row["queued_ms"] == pytest.approx(500)
    assert row["first_chunk_wait_ms"] == pytest.approx(500)
    assert row["in_chunks_ms"] == pytest.approx(500)
    assert row["between_chunks_ms"] == pytest.approx(300)  # 10.0 -> 10.8, 0.5 of it chunks
    assert row["others_chunks_ms"] == pytest.approx(100)  # 9's chunk; 8's was 7's own
    assert (row["chunks"], row["chunk_tokens"]) == (2, 150)
    assert log.take(7) is None and log.take(8) is not None


def test_rows_and_chunks_are_reported_by_time():
    log = PrefillLog()
    log.request_row(None, received=1.0, admitted=1.0, request_id="a", namespace="")
    log.request_row(None, received=5.0, admitted=5.0, request_id="b", namespace="")
    assert [r["request_id"] for r in log.report(since=2.0)["requests"]] == ["b"]


def test_the_fit_finds_the_fixed_cost_of_a_chunk():
    log = PrefillLog()
    for i, tokens in enumerate((16, 64, 256, 32)):
        log.chunk([1], start=float(i), seconds=(30 + 2 * tokens) / 1000, tokens=tokens, context=0)
    fit = fixed_cost(log.chunks_in())
    assert fit["fixed_ms"] == pytest.approx(30)
    assert fit["token_ms"] == pytest.approx(2)
    assert fixed_cost([]) == {"chunks": 0}


def test_chunks_evaluated_module_by_module_are_fitted_apart():
    # Their fixed cost is another (a hand-off per module): one line through both tells neither.
    log = PrefillLog()
    for i, tokens in enumerate((16, 64, 256, 32)):
        log.chunk([1], float(i), (8 + 2 * tokens) / 1000, tokens, 0)
        log.chunk([1], i + 0.5, (34 + 2 * tokens) / 1000, tokens, 0, by_module=True)
    fits = log.report()["fit_by_eval"]
    assert fits["whole"]["fixed_ms"] == pytest.approx(8)
    assert fits["module"]["fixed_ms"] == pytest.approx(34)
    assert fits["whole"]["chunks"] == fits["module"]["chunks"] == 4


class ReferenceLog:
    """Rows and chunks as the deques of dicts and ChunkRecords kept them (before the ring),
    kept here to compare against; fed the same tracks."""

    def __init__(self):
        self.chunks: deque[ChunkRecord] = deque(maxlen=prefill_log.KEEP)
        self.rows: deque[dict] = deque(maxlen=prefill_log.ROWS)

    def request_row(self, track, received, admitted, **facts) -> None:
        row = dict(facts, received=received, queued_ms=(admitted - received) * 1000)
        if track is None:
            row |= dict(chunks=0, chunk_tokens=0, first_chunk_wait_ms=0.0, in_chunks_ms=0.0)
            row |= dict(between_chunks_ms=0.0, others_chunks_ms=0.0, prefill_span_ms=0.0)
        else:
            span = track.last_end - track.first_start
            row |= dict(
                chunks=track.chunks,
                chunk_tokens=track.tokens,
                first_chunk_wait_ms=max(0.0, track.first_start - admitted) * 1000,
                in_chunks_ms=track.in_chunks_s * 1000,
                between_chunks_ms=max(0.0, span - track.in_chunks_s) * 1000,
                others_chunks_ms=min(track.others_s, max(0.0, span - track.in_chunks_s)) * 1000,
                prefill_span_ms=span * 1000,
            )
        self.rows.append(row)

    def report(self, since=0.0, until=float("inf")) -> dict:
        rows = [r for r in self.rows if since <= r["received"] <= until]
        chunks = [c for c in self.chunks if since <= c.start <= until]
        by_eval = {
            "whole": fixed_cost([c for c in chunks if not c.by_module]),
            "module": fixed_cost([c for c in chunks if c.by_module]),
        }
        return {
            "requests": rows,
            "chunks": len(chunks),
            "fit": fixed_cost(chunks),
            "fit_by_eval": by_eval,
        }


def random_traffic(requests: int, seed: int):
    """The same random chunks and requests told to the log and to the reference."""
    rng = random.Random(seed)
    log, ref = PrefillLog(), ReferenceLog()
    clock, uid = 0.0, 0
    for n in range(requests):
        uid += 1
        received = clock
        clock += rng.random() / 10
        for _ in range(rng.choice((0, 1, 3))):  # none: a resend restored whole
            uids = [uid] + ([uid + 1000] if rng.random() < 0.3 else [])
            seconds, tokens = rng.random() / 50, rng.choice((16, 64, 256))
            by_module = rng.random() < 0.2
            log.chunk(uids, clock, seconds, tokens, context=n, by_module=by_module)
            ref.chunks.append(ChunkRecord(clock, seconds, tokens, len(uids), n, by_module))
            clock += seconds + rng.random() / 100
        log.take(uid + 1000)
        track = log.take(uid)
        facts = dict(request_id=f"r{n}", namespace=rng.choice(("", "team")))
        if rng.random() < 0.7:  # as the generator tells them; tests tell fewer
            facts |= dict(prompt_tokens=rng.randrange(1, 9000), restored=rng.randrange(0, 64))
        admitted = received + rng.random() / 20
        log.request_row(track, received, admitted, **facts)
        ref.request_row(track, received, admitted, **facts)
    return log, ref


def test_past_keep_rows_and_chunks_the_newest_are_kept_in_order_and_reported_as_before():
    log, ref = random_traffic(prefill_log.ROWS + 300, seed=3)
    assert len(log.rows) == prefill_log.ROWS and len(log.chunks) == prefill_log.KEEP
    got, want = log.report(), ref.report()
    assert [r["request_id"] for r in got["requests"]] == [r["request_id"] for r in ref.rows]
    assert got["requests"][0]["request_id"] == "r300"  # the 300 oldest went
    assert log.chunks_in() == list(ref.chunks)
    assert got == want
    starts = [c.start for c in ref.chunks]
    for since, until in [(starts[100], starts[-100]), (starts[-1] + 1, float("inf"))]:
        assert log.report(since, until) == ref.report(since, until)


def test_a_row_has_the_facts_it_was_given_and_values_of_their_types():
    log, ref = random_traffic(50, seed=4)
    for got, want in zip(log.report()["requests"], ref.report()["requests"]):
        assert list(got) == list(want)  # the same keys in the same order
        assert [type(v) for v in got.values()] == [type(v) for v in want.values()]


def test_an_unknown_fact_is_refused_not_dropped():
    log = PrefillLog()
    with pytest.raises(TypeError, match="tenant"):
        log.request_row(None, received=1.0, admitted=1.0, request_id="a", tenant="x")
    assert len(log.rows) == 0


def test_the_rings_cost_their_full_size_at_construction():
    # 2 * KEEP chunks and rows allocate nothing that stays: the rings were allocated (and
    # written through) when the log was built. The strings are the caller's, shared here.
    # Only what the log's own modules hold is counted: the suite's other threads (Ray's,
    # gRPC's) allocate meanwhile, and tracemalloc traces every thread.
    tracemalloc.start()
    try:
        log = PrefillLog()
        built = held_by_log(tracemalloc.take_snapshot())
        for i in range(2 * max(prefill_log.KEEP, prefill_log.ROWS)):
            log.chunk([1], start=float(i), seconds=0.01, tokens=64, context=i)
            log.request_row(log.take(1), float(i), i + 0.5, request_id="r", namespace="")
        grown = held_by_log(tracemalloc.take_snapshot()) - built
    finally:
        tracemalloc.stop()
    assert grown < 16 * 1024, f"{grown} bytes allocated past construction"


def held_by_log(snapshot) -> int:
    """The traced bytes allocated in the prefill log's and the ring's own code."""
    own = [tracemalloc.Filter(True, prefill_log.__file__), tracemalloc.Filter(True, ring.__file__)]
    return sum(stat.size for stat in snapshot.filter_traces(own).statistics("filename"))
