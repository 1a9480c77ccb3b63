"""A restored cache continues exactly like a cold prefill, for every tiny arch.

Tolerance held: the max abs difference of float32 next-token logits (and of
log-probabilities on the BatchGenerator path) against the cold single-sequence
result is at most 1e-4 for every arch; observed at most ~1e-5 (exactly 0 for
qwen3_next and llama). The prompt (80 tokens) is longer than gemma3's 16-token
window, so its RotatingKVCache rotates before every restore point.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from engine.runtime.layer_caches import restore, snapshot_state, snapshot_state_single, store_entry
from engine.runtime.model.tiny_models import ARCHS, build_model

TOL = 1e-4
N, E = 30, 70  # checkpoint, entry end (prompt length 80)
# Restored prefill in chunks: shorter and longer than gemma3's window, single
# tokens (the rotating cache's in-place path), then the rest.
CHUNKS = (7, 20, 1, 1, 1)


def _prompts(length=80, diverged=45):
    """P, and a sibling Q that shares P[:N] and then diverges."""
    rng = np.random.default_rng(0)
    p = rng.integers(3, 4000, size=length).tolist()
    return p, p[:N] + rng.integers(3, 4000, size=diverged).tolist()


def _cold(model, tokens):
    return model(mx.array([tokens]), cache=make_prompt_cache(model))[0, -1]


def _logprobs(logits):
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _diff(a, b):
    return float(mx.abs(a - b).max())


def _prefill(model, cache, tokens, chunks=()):
    """Prefill tokens into cache in the given chunk sizes then the rest; last logits."""
    for size in chunks:
        model(mx.array([tokens[:size]]), cache=cache)
        tokens = tokens[size:]
    return model(mx.array([tokens]), cache=cache)[0, -1]


@pytest.mark.parametrize("arch", ARCHS)
def test_single_sequence_restore_matches_cold(arch):
    model = build_model(arch)
    p, _ = _prompts()
    cold = _cold(model, p)

    cache = make_prompt_cache(model)
    model(mx.array([p[:N]]), cache=cache)
    checkpoint = snapshot_state_single(cache)  # prefill stopped at N
    model(mx.array([p[N:E]]), cache=cache)
    layers, end = store_entry(cache)  # the entry: KV rows [:E] and the state at E

    diffs = {
        "checkpoint": _diff(_prefill(model, restore(layers, checkpoint, N), p[N:]), cold),
        "chunked": _diff(_prefill(model, restore(layers, checkpoint, N), p[N:], CHUNKS), cold),
        "entry_end": _diff(_prefill(model, restore(layers, end, E), p[E:]), cold),
        "entry_end_decode": _diff(_prefill(model, restore(layers, end, E), p[E:], [1] * 9), cold),
    }
    assert max(diffs.values()) <= TOL, diffs


def _run(gen, until):
    """Drive gen until every uid in ``until`` has finished; their final responses."""
    done = {}
    while len(done) < len(until):
        for r in gen.next_generated():
            if r.finish_reason is not None:
                done[r.uid] = r
    return done


@pytest.mark.parametrize("arch", ARCHS)
def test_batch_generator_capture_and_restore_match_cold(arch):
    """The model actor's path: capture inside a real BatchGenerator, store the
    extraction it hands back, restore through BatchGenerator.insert(caches=...)."""
    model = build_model(arch)
    p, q = _prompts()

    # Capture: P and Q prefill together, stopping at the segment boundary N.
    gen = BatchGenerator(model, max_tokens=2)
    up, uq = gen.insert_segments([[p[:N], p[N:]], [q[:N], q[N:]]])
    checkpoints, prompt_end, done = {}, None, {}
    while len(done) < 2:
        prompt_responses, generated = gen.next()
        for r in prompt_responses:
            # mlx-lm's own BatchGenerator (the engine's reads these in batch.py)
            if r.end_of_prompt and r.uid == up:  # P sits in the generation batch at len(P)
                batch = gen._generation_batch
                prompt_end = snapshot_state(batch.prompt_cache, batch.uids.index(r.uid))
            elif r.end_of_segment and r.uid not in checkpoints:
                batch = gen._prompt_batch
                checkpoints[r.uid] = snapshot_state(batch.prompt_cache, batch.uids.index(r.uid))
        done.update({r.uid: r for r in generated if r.finish_reason is not None})
    gen.close()
    assert checkpoints[up].length in (None, N) and prompt_end.length in (None, len(p))

    t1, t2 = done[up].all_tokens[len(p) :]
    assert done[up].all_tokens == p + [t1, t2]  # the extraction holds the last token too
    for uid in (up, uq):  # batched generation itself matches cold, the baseline
        cold = _logprobs(_cold(model, done[uid].all_tokens[:-1]))
        assert _diff(done[uid].logprobs, cold) <= TOL
    layers, end = store_entry(done[up].prompt_cache)  # the extraction, as is
    assert end.length in (None, len(p) + 2)

    # Restore three sequences from P's entry in one batch: Q at the shared
    # checkpoint N, P at its prompt end, and P at the entry end.
    x = 7
    gen = BatchGenerator(model, max_tokens=1)
    uids = gen.insert(
        prompts=[q[N:], [t1], [x]],
        caches=[
            restore(layers, checkpoints[uq], N),
            restore(layers, prompt_end, len(p)),
            restore(layers, end, len(p) + 2),
        ],
    )
    restored = _run(gen, uids)
    gen.close()
    for uid, tokens in zip(uids, (q, p + [t1], p + [t1, t2, x])):
        cold = _logprobs(_cold(model, tokens))
        assert _diff(restored[uid].logprobs, cold) <= TOL, (arch, tokens[-1])
        assert restored[uid].token == int(mx.argmax(cold))
