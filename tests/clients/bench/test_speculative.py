"""`lineage bench speculative` runs end to end on the embedded model (figures are not
checked: speed is shown by the benchmark itself, never by a timed test), free chat and
tool calls held to a JSON schema (constrained rows speculating)."""

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
    from engine.runtime.model.tiny_models import write_model_dir

    draft = write_model_dir("llama", tmp_path_factory.mktemp("draft"))  # the same tokenizer
    args = parser.parse_args(
        ["--streams", "2", "--tokens", "16", "--traffic", "chat,tool_schema", "--cache-dir",
         str(cache_dir), "--modes", "lookup,auto,mtp,draft", "--draft-model", str(draft)]
    )  # fmt: skip
    from clients.bench.speculative.run import measure

    return measure(args)


def test_every_mode_runs_every_traffic_and_speaks_like_off(figures):
    runs = figures["runs"]
    keys = {(r["traffic"], r["streams"], r["mode"]) for r in runs}
    traffics, modes = ("chat", "tool_schema"), ("off", "lookup", "auto", "mtp", "draft")
    assert keys == {(t, 2, m) for t in traffics for m in modes}
    assert all(r["identical_to_off"] for r in runs)
    assert all(r["tokens_received"] == [16] * r["streams"] for r in runs)
    # The held rows drafted: their matchers worked inside the verify steps.
    held = [r for r in runs if r["traffic"] == "tool_schema" and r["mode"] == "lookup"]
    assert all(r["steps"]["verify_steps"] and r["steps"]["matcher_ms"] > 0 for r in held)
    off = [r for r in runs if r["mode"] == "off"]
    assert all(r["per_stream_tps_vs_off"] == 1.0 and not r["steps"] for r in off)
    lookup = [r for r in runs if r["mode"] == "lookup"]
    assert all(r["steps"]["verify_steps"] + r["steps"]["plain_steps"] > 0 for r in lookup)
    heads = [r for r in runs if r["mode"] == "mtp"]  # the embedded model's MTP head drafted
    assert all(r["steps"]["head_ms"] > 0 and r["drafted"] > 0 for r in heads)
    drafted = [r for r in runs if r["mode"] == "draft"]
    # (held rows' drafts may all be cut by their grammar in 16 tokens)
    assert all(
        r["steps"]["verify_steps"] and r["drafted"] for r in drafted if r["traffic"] == "chat"
    )
    text = speculative.format_table(figures)
    assert "tok/s/stream" in text and "verify forward, rollback replay" in text
    json.dumps(figures)


def test_the_plot_draws_every_traffic(figures, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the bench extra (.[bench])")
    speculative.plot(figures, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").stat().st_size > 1000
