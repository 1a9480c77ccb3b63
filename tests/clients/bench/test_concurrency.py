"""The concurrency benchmark: its arithmetic (pure), its dropped calls sent as the real thing."""

from __future__ import annotations

import pytest

from clients.bench.concurrency import Sent
from clients.bench.concurrency.report import format_table, summarize


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
    assert s["short_turns_no_cold"] == 0
    # gaps 0.6-0.7 and 0.7-2.5 overlap cold0's wait (0-2.0); 2.5-2.6 does not
    assert s["itl_ms_p50_beside_prefill"] == pytest.approx((100 + 1800) / 2)
    assert s["prefill_tok_per_s"] == pytest.approx(1100 / 2.0)
    report = {"traffic": {"agents": 1, "prefix_tokens_estimate": 9}, "runs": {"batched": s}}
    assert "| batched |" in format_table(report)


def _dropped_then_retried(sent: list, traffic) -> None:
    """Each dropped call was cut after its drop point; its retry came next, whole."""
    by_key = {s.key: s for s in sent}
    specs = [r for r in traffic.requests if r.drop_after]
    assert specs, "the traffic has no dropped call"
    for spec in specs:
        got = by_key[f"r{spec.rid}"]
        assert not got.completed and len(got.chunk_times) == spec.drop_after, spec
        retry = next(r for r in traffic.requests if r.session == spec.session and r.rid > spec.rid)
        assert retry.kind == "retry" and by_key[f"r{retry.rid}"].completed


def test_drops_are_cancelled_mid_stream_and_retried(ray_session, tmp_path):
    """bench concurrency sends the traffic's dropped calls as the real thing: cancelled.

    On a random-weight model: a call is dropped after a few chunks, and the trained
    embedded model may end its reply before that."""
    from clients.bench.agents.traffic import build_traffic
    from clients.bench.concurrency import ConcurrencyOptions, EngineSender, drive
    from engine.runtime.model.tiny_models import write_model_dir

    model = write_model_dir("qwen3_next", tmp_path / "random")
    opts = ConcurrencyOptions(model=str(model), cold_every=0)
    traffic = build_traffic(0, 0.05, 2)
    sender = EngineSender(opts, "srpt", 1, str(tmp_path / "cache"))
    try:
        sent = drive(sender, traffic, opts, solo=False)
    finally:
        sender.close()
    _dropped_then_retried(sent, traffic)


def test_the_peer_hangs_up_a_dropped_call(tmp_path):
    """mlx_lm.server gets the same: the client closes the connection at the drop point
    (on a random-weight model, whose replies run to max_tokens)."""
    from clients.bench.peer import MlxLmServer
    from engine.runtime.model.tiny_models import write_model_dir

    messages = [{"role": "user", "content": "Count to one hundred, slowly."}]
    with MlxLmServer(str(write_model_dir("qwen3_next", tmp_path / "random"))) as server:
        dropped = server.stream(messages, max_tokens=64, drop_after=2)
        whole = server.stream(messages, max_tokens=8)
    assert not dropped.completed and len(dropped.chunk_times) == 2
    assert whole.completed


def test_the_trace_traffic_shares_a_conversations_text_between_its_turns():
    from clients.bench.concurrency.trace import TraceTraffic

    traffic = TraceTraffic(0, 60, 0.05, 30.0, 16, every=100)
    requests = traffic.requests
    assert len(requests) == 60 and requests[-1].at_s == pytest.approx(30.0)
    assert [r.at_s for r in requests] == sorted(r.at_s for r in requests)
    system = {r.messages[0]["content"] for r in requests}
    assert len(system) == 1  # block 0: every prompt's
    warm = [r for r in requests if r.kind == "warm"]
    assert warm and all(r.max_tokens <= 16 for r in requests)
    # A next turn starts with an earlier turn's text of its conversation (its blocks).
    for r in warm:
        user = r.messages[1]["content"]
        earlier = [q for q in requests if q.at_s < r.at_s and len(q.messages) > 1]
        assert any(user.startswith(q.messages[1]["content"][:200]) for q in earlier), r.key
    summary = traffic.summary()
    assert summary["requests"] == 60 and summary["cold"] == 60 - len(warm)
    report = {"traffic": summary, "runs": {}}
    assert "first turns" in format_table(report)


def test_a_srpt_bound_run_takes_the_wait_bounds_the_engine_takes():
    from clients.bench.concurrency import ConcurrencyOptions, _bound_run, run_bench

    assert _bound_run("srpt-bound2.5") == 2.5 and _bound_run("srpt-bound0") == 0.0
    for name in ("srpt-bound0.5", "srpt-bound", "srpt-boundx", "srpt-boundnan", "fifo-bound2"):
        assert _bound_run(name) is None, name
    with pytest.raises(ValueError, match="unknown runs.*srpt-bound0.5"):
        run_bench(ConcurrencyOptions(model="", runs=("srpt-bound4", "srpt-bound0.5")))
