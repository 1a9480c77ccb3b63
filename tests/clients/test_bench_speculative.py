"""`lineage bench speculative` runs end to end on the embedded model (figures are not
checked: speed is shown by the benchmark itself, never by a timed test)."""

from __future__ import annotations

import argparse
import json

import pytest

from clients.bench import speculative


@pytest.fixture(scope="module")
def figures(tmp_path_factory) -> dict:
    parser = argparse.ArgumentParser()
    speculative.add_arguments(parser)
    cache_dir = tmp_path_factory.mktemp("spec-cache")
    from engine.runtime.tiny_models import write_model_dir

    draft = write_model_dir("llama", tmp_path_factory.mktemp("draft"))  # the same tokenizer
    args = parser.parse_args(
        ["--streams", "1,2", "--tokens", "12", "--traffic", "chat", "--cache-dir",
         str(cache_dir), "--modes", "lookup,auto,draft", "--draft-model", str(draft)]
    )  # fmt: skip
    from clients.bench.speculative_run import measure

    return measure(args)


def test_every_mode_runs_every_traffic_and_speaks_like_off(figures):
    runs = figures["runs"]
    keys = {(r["traffic"], r["streams"], r["mode"]) for r in runs}
    assert keys == {
        (t, k, m) for t in ("chat",) for k in (1, 2) for m in ("off", "lookup", "auto", "draft")
    }
    assert all(r["identical_to_off"] for r in runs)
    assert all(r["tokens_received"] == [12] * r["streams"] for r in runs)
    off = [r for r in runs if r["mode"] == "off"]
    assert all(r["per_stream_tps_vs_off"] == 1.0 and not r["steps"] for r in off)
    lookup = [r for r in runs if r["mode"] == "lookup"]
    assert all(r["steps"]["verify_steps"] + r["steps"]["plain_steps"] > 0 for r in lookup)
    drafted = [r for r in runs if r["mode"] == "draft"]
    assert all(r["steps"]["verify_steps"] > 0 and r["drafted"] > 0 for r in drafted)
    text = speculative.format_table(figures)
    assert "tok/s/stream" in text and "verify forward, rollback replay" in text
    json.dumps(figures)


def test_the_plot_draws_every_traffic(figures, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the bench extra (.[bench])")
    speculative.plot(figures, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").stat().st_size > 1000
