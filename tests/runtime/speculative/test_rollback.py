"""After a verify forward keeps j of its k+1 positions, every layer is plain decoding's.

For every tiny arch (so every cache kind: KV, the CacheList of MLA latent KV
and DSA indexer keys, GDN/KDA/Mamba conv and recurrent state, the sliding
window), rows of one generation batch feed their current token and k drafts
in one forward, and each row keeps a different count (all, some, only the
current token). Each row's layers, extracted and stored as the lineage cache
stores them (append-only rows and state snapshots), must equal a single
sequence's after plain decoding of the same kept tokens, one per forward:
relative L2 at most 1e-5 for every array.
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from engine.runtime.batching.batch import LineageBatchGenerator
from engine.runtime.layer_caches import store_entry
from engine.runtime.model.tiny_models import ARCHS, build_model
from engine.runtime.speculative import rollback
from engine.runtime.speculative.state_replay import MixerTaps

REL_L2 = 1e-5
K = 4


def rel_l2(a: mx.array, b: mx.array) -> float:
    a, b = np.asarray(a.astype(mx.float32)), np.asarray(b.astype(mx.float32))
    assert a.shape == b.shape
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def entry_arrays(obj):
    """Every array inside a stored entry (nested tuples, dicts by key, dataclasses), in order."""
    if isinstance(obj, mx.array):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from entry_arrays(item)
    elif isinstance(obj, dict):
        for key in sorted(obj):
            yield from entry_arrays(obj[key])
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from entry_arrays(getattr(obj, field.name))


def _plain(model, tokens: list[int], fed: list[int]) -> list:
    """A single sequence's caches: the prompt, then `fed` one token per forward."""
    cache = make_prompt_cache(model)
    model(mx.array([tokens]), cache=cache)
    for t in fed:
        model(mx.array([[t]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mixers", [False, True], ids=["whole-model", "mixers-alone"])
def test_rollback_leaves_each_row_as_plain_decoding(arch, mixers):
    model = build_model(arch)
    taps = MixerTaps.of(model) if mixers else None
    if mixers:  # the recurrent archs replay their mixers alone; the others have none to
        assert (taps is not None) == (arch in ("qwen3_next", "kimi_linear", "mamba2"))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 4000, size=n).tolist() for n in (21, 40, 33)]
    gen = LineageBatchGenerator(model, max_tokens=64, prefill_step_size=16)
    gen.insert_segments([[p] for p in prompts])
    while len(gen._generation_batch) < len(prompts):  # all of them decoding
        gen.next()
    gen.next()  # a decode step on the merged batch
    batch = gen._generation_batch
    context = [list(t) for t in batch.tokens]  # what each row's caches hold
    current = batch._next_tokens.tolist()
    inputs = [[c] + rng.integers(3, 4000, size=K).tolist() for c in current]
    keep = [K + 1, 3, 1]  # all, the current token and two drafts, the current token alone

    snapshot = rollback.take(batch.prompt_cache, taps)
    model(mx.array(inputs), cache=batch.prompt_cache)
    replayed = rollback.roll_back(model, batch.prompt_cache, snapshot, inputs, keep)
    assert replayed == (0 if arch in ("llama", "glm_moe_dsa") else K + 1)

    for r in range(len(prompts)):
        row = [c.extract(r) for c in batch.prompt_cache]
        plain = _plain(model, context[r], inputs[r][: keep[r]])
        got, want = store_entry(row), store_entry(plain)
        got_arrays, want_arrays = list(entry_arrays(got)), list(entry_arrays(want))
        assert len(got_arrays) == len(want_arrays) > 0
        worst = max(rel_l2(a, b) for a, b in zip(got_arrays, want_arrays))
        assert worst <= REL_L2, (arch, r, keep[r], worst)
    gen.close()
