"""The prefill log (engine.runtime.batching.prefill_log), pure: a request's time split from
its chunks, and the chunk cost fit. Times are injected."""

from __future__ import annotations

import pytest

from engine.runtime.batching.prefill_log import PrefillLog, fixed_cost


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
