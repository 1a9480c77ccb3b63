"""The shape-true models: each shape's caches hold, layer for layer, what its config says.

Each shape is built at its cut depth narrowed as `lineage bench memory` runs it by default
(`shape_models.narrowed`: the widths no cache depends on made small), run on a few tokens,
and its checkpoint's and KV token's bytes are compared with the arithmetic of
`engine.runtime.model.shape_models`, which must equal the full-width cut model's; the
published Qwen3-Next-80B-A3B figures are checked against the numbers of its config.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.runtime import layer_caches
from engine.runtime.model import shape_models
from engine.runtime.model.shape_models import expected, load_shape, narrowed, shape_names

MiB, KiB = 1 << 20, 1 << 10


@pytest.mark.parametrize("name", shape_names())
def test_cut_model_caches_match_the_config(name):
    shape = narrowed(load_shape(name))
    model = shape_models.build_shape_model(shape)
    cache = model.make_cache()
    mx.eval(model(mx.array([list(range(10, 26))]), cache=cache))
    layers, state = layer_caches.store_entry(cache)
    want = expected(shape.config)
    assert state.nbytes == want["checkpoint_bytes"], name
    assert layer_caches.kv_bytes_per_token(layers) == want["kv_bytes_per_token"], name
    # The narrowing touches no width a cache holds.
    assert want == expected(load_shape(name).config), name
    # Whole periods only: the cut depth is a multiple of the period.
    assert shape.config["num_hidden_layers"] % shape.period == 0


def test_qwen3_next_published_figures():
    """36 GDN layers x (2 MiB float32 state + 48 KiB conv), 12 attention layers x 2 x 2 KV
    heads x 256 x 2 bytes: the figures the memory shares are sized by."""
    full = expected(load_shape("qwen3_next_80b_a3b").published)
    assert (full["state_layers"], full["kv_layers"]) == (36, 12)
    assert full["checkpoint_bytes"] == 36 * (2 * MiB + 48 * KiB)
    assert full["kv_bytes_per_token"] == 24 * KiB


def test_unknown_shape_is_refused_by_name():
    with pytest.raises(ValueError, match="known: .*qwen3_next_80b_a3b"):
        load_shape("qwen9")
