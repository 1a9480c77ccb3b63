"""`lineage bench kernels` runs end to end on a small layer (figures are not checked: speed
is shown by the benchmark itself, never by a timed test)."""

from __future__ import annotations

import json

import pytest

from clients.bench import kernels
from clients.bench.kernels import sparse as sparse_layer


@pytest.fixture(scope="module")
def figures() -> dict:
    """The layer and gated-delta figures of a small run (as `lineage bench kernels` makes)."""
    return {
        "layer": sparse_layer.layer_bench(context=256, heads=2, repeats=1, chunks=(1, 2, 129)),
        "gated_delta": kernels.gated_delta_bench(1, steps=(1,)),
    }


def test_layer_and_gated_delta_figures_report(figures):
    rows = figures["layer"]["rows"]
    assert [r["path"] for r in rows] == ["stock", "decode", "decode"]
    assert all(r["rel_l2"] <= 1e-5 for r in rows)
    assert rows[2]["block_union"] is not None and figures["gated_delta"][0]["bit_identical"]
    assert figures["gated_delta"][0]["host_max_diff"] <= 1e-4  # the host recurrence agrees
    text = kernels.report(figures)
    assert "context 256, index_topk 32" in text and "T=   1" in text and "host" in text
    assert "      L    stock ms     ours ms   speedup  path    rel L2   block union" in text
    json.dumps(figures)  # --json writes it as is


def test_the_plot_draws_the_layer_figures(figures, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the bench extra (.[bench])")
    kernels.plot(figures, str(tmp_path / "k.png"))
    assert (tmp_path / "k.png").stat().st_size > 1000
    kernels.plot({"gated_delta": figures["gated_delta"]}, str(tmp_path / "none.png"))
    assert not (tmp_path / "none.png").exists(), "nothing to draw without the layer"


def _selections(clustered: bool, context=2048, chunk=256):
    """(share of the chunk's picks at hot positions, block union share) on a small layer."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.base import create_attention_mask

    from engine.kernels import sparse_attention as sa

    attn = sparse_layer.layer(context, heads=2, seed=0)
    hot = sparse_layer.Clustering(attn, context, seed=2) if clustered else None
    cache = sparse_layer.filled_cache(attn, context, 1, hot)
    mx.random.seed(3)
    x = mx.random.normal((1, chunk, attn.hidden_size))
    x = hot.chunk(x) if hot else x
    mask = create_attention_mask(x, cache[0], return_array=True)
    topk = attn.indexer(x, attn.q_a_layernorm(attn.q_a_proj(x)), mask, cache=cache[1])
    union = sa.selected_blocks(topk, context + chunk, 64).shape[1] / -(-(context + chunk) // 64)
    picks = np.array(topk).reshape(-1)
    in_hot = np.concatenate([hot.hot, np.ones(chunk, bool)])[picks].mean() if hot else None
    return in_hot, union


def test_clustered_selections_keep_to_the_hot_blocks():
    """--selections clustered: the chunk's queries pick sinks, the recent window, topic
    spans and the chunk itself, so their union leaves most blocks out; random
    weights' selections cover every block."""
    in_hot, union = _selections(clustered=True)
    assert in_hot > 0.99 and union < 0.4, (in_hot, union)
    assert _selections(clustered=False)[1] == 1.0


def test_block_gather_pays_on_clustered_unions_only():
    """The router's cost check on the bench layer (16k context, topk 2048): block-gather
    for a 512-token chunk whose union is 18% of the context (measured 4.5 s against
    4.9 s for the decode shape), the decode shape when the union is everything."""
    from engine.kernels import sparse_attention as sa

    attn = sparse_layer.layer(16384, heads=8, seed=0)
    n = 16384 + 512
    assert sa.gather_pays(attn, int(0.18 * n), 512, 2048)
    assert not sa.gather_pays(attn, n, 512, 2048)
    assert not sa.gather_pays(attn, n, 256, 2048)


def test_dense_figures_report_equal_logits():
    """The dense part: a chunk row and the left-padded decode-batch row, stock vs host,
    logits equal within float tolerance; the report names both."""
    from clients.bench.kernels import dense as dense_kernel

    rows = dense_kernel.dense_bench(contexts=(1100,), chunks=(3,), repeats=1)
    assert [r["chunk"] for r in rows] == [3, 1] and rows[1]["context"] == [1100, 825, 550]
    assert all(r["max_logit_diff"] <= 1e-4 and r["same_argmax"] for r in rows)
    text = kernels.report({"dense": rows})
    assert "ctx   1100  L   3" in text and "batch 1100/825/550" in text
    json.dumps(rows)


def test_linear_figures_report_both_paths_and_agreeing_logits():
    """The host-linear part: the product's two rates, a prefill row and a decode row, MLX's
    matmul vs the host BLAS, logits agreeing to float32 rounding; the report names them."""
    from clients.bench.kernels import linear as linear_kernel

    out = linear_kernel.linear_bench(chunks=(40,), tokens=81, decode_rows=(2,), repeats=1)
    rows = out["rows"]
    assert [r.get("prefill_chunk") for r in rows] == [40, None] and rows[1]["decode_rows"] == 2
    for name in ("float32", "bfloat16", "float16"):
        assert out["product"][name]["mlx_gflops"] > 0 and out["product"][name]["host_gflops"] > 0
    assert all(r["max_logit_diff"] <= 1e-4 and r["same_argmax"] for r in rows)
    assert all(r["stock_ms"] > 0 and r["host_ms"] > 0 for r in rows)
    text = kernels.report({"linear": out})
    assert "prefill in chunks of   40" in text and "decode step of  2 rows" in text
    assert "GFLOP/s" in text and "bfloat16" in text
    json.dumps(out)
