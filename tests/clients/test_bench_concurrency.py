"""The concurrency benchmark's arithmetic (pure): ratios to solo, gaps beside prefills, rates."""

from __future__ import annotations

import pytest

from clients.bench.concurrency import Sent
from clients.bench.concurrency_report import format_table, summarize


def test_summary_figures_from_client_records():
    cold = Sent("cold0", "cold", 0.0, t_first=2.0, t_end=2.1, prompt_tokens=1000)
    warm = Sent(
        "r1", "warm", 0.5, t_first=0.6, t_end=3.0, chunk_times=[0.6, 0.7, 2.5, 2.6],
        prompt_tokens=500, cached_tokens=400,
    )  # fmt: skip
    solo = [Sent("cold0", "cold", 0.0, t_first=1.0), Sent("r1", "warm", 0.0, t_first=0.05)]
    s = summarize([cold, warm], solo, None)
    assert s["ttft_over_solo_p50"] == pytest.approx((2.0 + 2.0) / 2)
    # r1 is a short warm turn (100 uncached) sent while cold0 prefilled
    assert s["short_turns_during_cold"] == 1 and s["short_turn_over_solo_max"] == pytest.approx(2)
    # gaps 0.6-0.7 and 0.7-2.5 overlap cold0's wait (0-2.0); 2.5-2.6 does not
    assert s["itl_ms_p50_beside_prefill"] == pytest.approx((100 + 1800) / 2)
    assert s["prefill_tok_per_s"] == pytest.approx(1100 / 2.0)
    report = {"traffic": {"agents": 1, "prefix_tokens_estimate": 9}, "runs": {"batched": s}}
    assert "| batched |" in format_table(report)
