"""`lineage bench kernels` runs end to end on a small layer (figures are not checked: speed
is shown by the benchmark itself, never by a timed test)."""

from __future__ import annotations

import json

from clients.bench import kernels


def test_layer_and_gated_delta_figures_report_and_plot(tmp_path):
    out = {
        "layer": kernels.layer_bench(context=256, heads=2, repeats=1, chunks=(1, 2, 129)),
        "gated_delta": kernels.gated_delta_bench(1, steps=(1,)),
    }
    rows = out["layer"]["rows"]
    assert [r["path"] for r in rows] == ["stock", "decode", "decode"]
    assert all(r["rel_l2"] <= 1e-5 for r in rows)
    assert rows[2]["block_union"] is not None and out["gated_delta"][0]["bit_identical"]
    text = kernels.report(out)
    assert "context 256, index_topk 32" in text and "T=   1" in text
    kernels.plot(out, str(tmp_path / "k.png"))
    assert (tmp_path / "k.png").stat().st_size > 1000
    json.dumps(out)  # --json writes it as is
