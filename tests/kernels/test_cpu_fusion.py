"""Fused norms and decode RoPE on the CPU (engine/kernels/cpu_fusion.py) change no number.

Every tiny architecture, a prompt then decode steps on a left-padded batch
cache (per-row offsets: the compiled RoPE's shape) and on a single cache (an
integer offset: MLX's own path): the logits equal the stock model's bit for
bit; installing swaps exactly the stock classes' instances, and uninstalling
gives them back.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from engine.kernels import cpu_fusion
from engine.runtime.batching.batch import merge_with_room
from engine.runtime.model.tiny_models import ARCHS, build_model

PROMPTS = ([5, 17, 300, 42, 99, 1000, 7], [8, 9, 10], [11, 12, 13, 14, 15])


def _decode(model, batched: bool, steps: int = 4) -> list:
    """Logits of each prompt's prefill and of `steps` greedy decode steps after it."""
    prompts = PROMPTS if batched else PROMPTS[:1]
    caches, out, last = [], [], []
    for p in prompts:
        cache = make_prompt_cache(model)
        logits = model(mx.array([p]), cache=cache)[:, -1, :]
        out.append(logits)
        caches.append(cache)
        last.append(mx.argmax(logits, axis=-1))
    cache = merge_with_room(caches, room=steps) if batched else caches[0]
    y = mx.concatenate(last)
    for _ in range(steps):
        logits = model(y[:, None], cache=cache)[:, -1, :]
        out.append(logits)
        y = mx.argmax(logits, axis=-1)
    mx.eval(out)
    return out


@pytest.mark.parametrize("batched", [True, False], ids=["batch-cache", "single-cache"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_forward_equals_the_stock_one(arch, batched):
    model = build_model(arch)
    stock = _decode(model, batched)
    installed = cpu_fusion.install(model)
    try:
        fused = _decode(model, batched)
    finally:
        cpu_fusion.uninstall(model)
    kinds = {type(m) for m in model.modules()}
    assert installed == bool(kinds & set(cpu_fusion.SWAPS))
    for a, b in zip(fused, stock, strict=True):
        assert mx.array_equal(a, b).item()


def test_install_swaps_the_stock_instances_and_uninstall_gives_them_back():
    model = build_model("qwen3_next")
    before = [type(m) for m in model.modules()]
    assert cpu_fusion.install(model)
    during = [type(m) for m in model.modules()]
    assert nn.RMSNorm not in during and nn.RoPE not in during
    assert [cpu_fusion.UNSWAPS.get(t, t) for t in during] == before
    cpu_fusion.uninstall(model)
    assert [type(m) for m in model.modules()] == before
