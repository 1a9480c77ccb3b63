"""The concurrency bench's time split (clients.bench.concurrency.time_split): the engine's
prefill log by kind of request, beside the client's TTFT."""

from __future__ import annotations

import pytest

from clients.bench.concurrency.senders import Sent
from clients.bench.concurrency.time_split import split_lines, time_split


def row(namespace, queued, wait, chunks_ms, between, chunks, others=0.0):
    return dict(
        namespace=namespace, queued_ms=queued, first_chunk_wait_ms=wait,
        in_chunks_ms=chunks_ms, between_chunks_ms=between, chunks=chunks,
        others_chunks_ms=others,
    )  # fmt: skip


def test_the_split_by_kind_and_what_the_engine_did_not_see():
    log = {
        "requests": [row("cold", 0, 100, 600, 300, 10, 200), row("", 50, 0, 50, 0, 1)],
        "chunks": 11,
        "fit": {"chunks": 11, "fixed_ms": 20.0, "token_ms": 1.0, "median_tokens": 64,
                "median_ms": 80.0, "total_ms": 650.0},
    }  # fmt: skip
    sent = [Sent("c", "cold", 0.0, 1.2, 1.3), Sent("w", "warm", 0.0, 0.15, 0.2)]
    split = time_split(log, sent)
    cold = split["cold"]
    assert cold["between_chunks_ms"]["share"] == pytest.approx(0.3)
    assert cold["others_chunks_ms"]["p50"] == 200 and cold["loop_between_ms"]["p50"] == 100
    assert cold["engine_ms_p50"] == pytest.approx(1000)
    assert cold["outside_ms_p50"] == pytest.approx(200)  # 1.2 s client TTFT less 1.0 s
    assert split["warm"]["queued_ms"]["p50"] == 50
    assert split["fit"]["fixed_share"] == pytest.approx(20 * 11 / 650)
    text = "\n".join(split_lines({"srpt": split}))
    assert "| 200 (20%) / 100 (10%) |" in text
    assert "| srpt | cold | 1 |" in text and "fixed 20.0 ms" in text
