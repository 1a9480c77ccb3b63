"""The peers of the benchmarks (clients.bench.peers) and the figures they are compared by:
pure, no server started (the real mlx_lm.server runs in test_concurrency.py)."""

from __future__ import annotations

import pytest

from clients.bench import peers
from clients.bench.concurrency import Sent
from clients.bench.concurrency.report import cold_prefill, format_table, summarize
from clients.bench.decode.layers import LayerRun, StreamFigures
from clients.bench.decode.run import _figures


def test_a_peer_not_installed_is_skipped_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("LINEAGE_PEERS_DIR", str(tmp_path))
    assert peers.unavailable("mlx_lm.server") is None  # this environment's
    reason = peers.unavailable("mlx_vlm.server")
    assert "mlx-vlm==0.7.10 is not installed" in reason and str(tmp_path) in reason
    server, why = peers.start_or_reason("rapid_mlx", str(tmp_path))
    assert server is None and "rapid-mlx==0.16.10" in why


def test_a_failed_install_is_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("LINEAGE_PEERS_DIR", str(tmp_path))
    venv = tmp_path / "rapid-mlx"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/bin/true")
    (venv / "install-failed.txt").write_text("No matching distribution for mlx-metal\n")
    assert peers.unavailable("rapid_mlx") == (
        "rapid-mlx==0.16.10 failed to install here: No matching distribution for mlx-metal"
    )


def test_peers_see_the_model_without_the_files_they_refuse(tmp_path, monkeypatch):
    monkeypatch.setenv("LINEAGE_PEERS_DIR", str(tmp_path / "peers"))
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "mtp.safetensors", "tokenizer.json"):
        (model / name).write_text(name)
    view = peers.model_view(str(model))
    got = sorted(p.name for p in (tmp_path / "peers" / "models" / "model").iterdir())
    assert got == ["config.json", "model.safetensors", "tokenizer.json"]
    assert view.endswith("models/model") and peers.model_view(str(model)) == view
    plain = tmp_path / "plain"
    plain.mkdir()
    assert peers.model_view(str(plain)) == str(plain.resolve())


def _cold(key, tokens, ttft_s, t_send=0.0):
    return Sent(key, "cold", t_send, t_first=t_send + ttft_s, t_end=t_send + ttft_s + 0.1,
                prompt_tokens=tokens)  # fmt: skip


def test_cold_prefill_rate_and_worst_ttft_by_length():
    sent = [
        _cold("c1", 1000, 2.0),  # 500 tok/s
        _cold("c2", 3000, 2.0),  # 1500 tok/s
        _cold("c3", 5000, 10.0),  # 500 tok/s, the longest
        _cold("c4", 700, 0.1),  # under 800 tokens: no rate
        Sent("w1", "warm", 0.0, t_first=0.3, prompt_tokens=900, cached_tokens=800),
        Sent("w2", "warm", 0.0, t_first=4.0, prompt_tokens=1500, cached_tokens=1400),
    ]
    got = cold_prefill(sent)
    assert got["cold_prompts"] == 3
    assert got["cold_prefill_tok_per_s_p50"] == pytest.approx(500)
    assert got["cold_prefill_tok_per_s_min"] == pytest.approx(500)
    assert (got["longest_cold_tokens"], got["longest_cold_ttft_ms"]) == (5000, 10_000)
    assert got["worst_ttft_ms_by_length"] == {
        "<1024": pytest.approx(2000),
        "<2048": pytest.approx(4000),
        "<4096": pytest.approx(2000),
        "<8192": pytest.approx(10_000),
    }


def test_the_table_shows_skipped_peers_and_the_spread_over_rounds():
    s = summarize([_cold("c1", 1000, 2.0), _cold("c2", 900, 1.0, 5.0)], [], None)
    s["rounds"] = [
        {"ttft_ms_p50": 100, "ttft_ms_p90": 200, "cold_prefill_tok_per_s_p50": 400,
         "longest_cold_ttft_ms": 2000},
        {"ttft_ms_p50": 140, "ttft_ms_p90": 260, "cold_prefill_tok_per_s_p50": 500,
         "longest_cold_ttft_ms": 3000},
    ]  # fmt: skip
    report = {
        "traffic": {"agents": 1, "prefix_tokens_estimate": 9},
        "runs": {"srpt": s, "rapid_mlx": {"skipped": "rapid-mlx==0.16.10 is not installed"}},
        "load_average": [(1.0, 2.0, 3.0), (1.5, 2.5, 3.5)],
    }
    text = format_table(report)
    assert "rapid_mlx: skipped: rapid-mlx==0.16.10 is not installed" in text
    assert "| srpt | 700 (500, n=2) | 1000, 2.00 |" in text  # 500 and 900 tok/s
    assert (
        "- srpt (2 rounds): 120 (100-140); 230 (200-260); 450 (400-500); 2500 (2000-3000)" in text
    )
    assert "1.00, 2.00, 3.00 / 1.50, 2.50, 3.50" in text


def _run(layer, tps):
    streams = [StreamFigures(101, first=0.0, last=100 / tps, sent=0.0)]
    return LayerRun(layer, streams)


def test_decode_figures_are_medians_of_interleaved_rounds_against_the_faster_peer():
    runs = [(1, 100, _run(layer, tps)) for layer, tps in [
        ("bridge", 100), ("mlx_vlm.server", 80), ("rapid_mlx", 125), ("mlx_lm.server", 50),
        ("bridge", 120), ("mlx_vlm.server", 90), ("rapid_mlx", 75), ("mlx_lm.server", 50),
        ("bridge", 110), ("mlx_vlm.server", 100), ("rapid_mlx", 100), ("mlx_lm.server", 50),
    ]]  # fmt: skip
    rows = {r["layer"]: r for r in _figures("m", [0], runs)["runs"]}
    bridge = rows["bridge"]
    assert bridge["rounds"] == 3 and bridge["per_stream_tps"] == pytest.approx(110)
    assert bridge["aggregate_spread"] == (pytest.approx(100, 0.02), pytest.approx(120, 0.02))
    assert bridge["vs_server"] == pytest.approx(2.2, 0.01)
    assert bridge["vs_peer"] == pytest.approx(1.1, 0.01)  # rapid_mlx's median, 100 > 90
