"""The engine's own LineageBatchGenerator decodes exactly like a cold single sequence.

Its three changes to mlx-lm's batches, on every tiny arch that has a restore
equivalence test (test_restore_equivalence): restored caches merged with room
for the rest of the prompt (`merge_with_room`), a prompt batch split without a
deep copy while other sequences keep prefilling (`split`), and a sequence that
finishes alone leaving with views of its rows (`extract_alone`) beside several
finishing at once (mlx-lm's copying extraction). Every generated token's
log-probabilities are compared with a cold forward of the same tokens.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from engine.runtime.batching.batch import LineageBatchGenerator
from engine.runtime.layer_caches import restore, store_entry
from engine.runtime.model.tiny_models import ARCHS, build_model

TOL = 1e-4


def _cold_logprobs(model, tokens):
    logits = model(mx.array([tokens]), cache=make_prompt_cache(model))[0, -1]
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _drive(gen, uids, prompts):
    """Run until every uid finished; per uid, (tokens generated, their logprobs, final)."""
    seen = {u: ([], []) for u in uids}
    done = {}
    while len(done) < len(uids):
        _, generated = gen.next()
        for r in generated:
            seen[r.uid][0].append(int(r.token))
            seen[r.uid][1].append(r.logprobs)
            if r.finish_reason is not None:
                done[r.uid] = r
    return seen, done


def _check(model, prompts, uids, seen) -> float:
    worst = 0.0
    for uid, prompt in zip(uids, prompts):
        tokens, logprobs = seen[uid]
        for i, lp in enumerate(logprobs):
            cold = _cold_logprobs(model, list(prompt) + tokens[:i])
            worst = max(worst, float(mx.abs(lp - cold).max()))
            assert tokens[i] == int(mx.argmax(cold)), (uid, i)
    return worst


@pytest.mark.parametrize("arch", ARCHS)
def test_lineage_batches_decode_like_cold_sequences(arch):
    model = build_model(arch)
    rng = np.random.default_rng(1)
    base = rng.integers(3, 4000, size=60).tolist()

    # 1. Cold prompts of different lengths in one batch, prefilled in small chunks:
    # the short ones move to decode first (a split while the long one prefills).
    gen = LineageBatchGenerator(model, max_tokens=3, prefill_step_size=16)
    prompts = [base[:20], base[:60], base[:37]]
    uids = gen.insert_segments([[p] for p in prompts])
    seen, done = _drive(gen, uids, prompts)
    assert _check(model, prompts, uids, seen) <= TOL

    # Stored entries from those extractions: several finished together (copies) and
    # the last one alone (views).
    entries = {}
    for uid in uids:
        layers, end = store_entry(done[uid].prompt_cache)
        entries[uid] = (layers, end, done[uid].all_tokens)
    gen.close()

    # 2. Restore them into one batch with prompts of different lengths left: the
    # merge copies their rows into buffers with room for the rest.
    gen = LineageBatchGenerator(model, max_tokens=3, prefill_step_size=16)
    prompts, caches, tails = [], [], []
    for k, uid in enumerate(uids):
        layers, end, all_tokens = entries[uid]
        tail = rng.integers(3, 4000, size=5 + 9 * k).tolist()
        caches.append(restore(layers, end, len(all_tokens)))  # the extraction holds them all
        prompts.append(all_tokens + tail)
        tails.append(tail)
    restored = gen.insert_segments([[t] for t in tails], caches=caches)
    seen, _ = _drive(gen, restored, prompts)
    assert _check(model, prompts, restored, seen) <= TOL
    gen.close()
