"""Speculative decoding gives greedy decoding's tokens, token for token, on every tiny arch.

Drafts come from the plain run's own reply with one token changed at a
position that moves from step to step (`_oracle`), so every verify accepts
all, some or none of its drafts and every rollback path runs: KV trimmed and
rows re-padded, state restored and replayed. At batch 1 and 8, with prompts
admitted while others decode (their prefill chunks interleave with verify
steps) under the engine's chunked schedule; prompt-lookup drafts on top.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.runtime.batching.batch import LineageBatchGenerator
from engine.runtime.batching.chunked import ChunkedBatchGenerator
from engine.runtime.batching.prefill_policy import PrefillScheduler
from engine.runtime.model.tiny_models import ARCHS, build_model
from engine.runtime.speculative.drafts import PromptLookup, ScriptedDrafts
from engine.runtime.speculative.speculative_batch import Speculation

MAX_TOKENS = 20


def _chunked(model, speculation=None, max_tokens=MAX_TOKENS):
    scheduler = PrefillScheduler("srpt", 16, 1, step_factor=2.5, slice_ms=50.0, overlap=True)
    return ChunkedBatchGenerator(
        model,
        scheduler=scheduler,
        max_tokens=max_tokens,
        prefill_step_size=16,
        completion_batch_size=8,
        prefill_batch_size=8,
        speculation=speculation,
    )


def _run(gen, prompts, late=()):
    """Every prompt to its end; prompts in `late` are inserted after a few decode steps."""
    uids = {}
    first = [i for i in range(len(prompts)) if i not in late]
    for i, uid in zip(first, gen.insert_segments([[prompts[i]] for i in first])):
        uids[uid] = i
    out = {i: [] for i in range(len(prompts))}
    done, steps = set(), 0
    stats = getattr(gen._generation_batch, "stats", None)
    gen.beside = 0  # steps where a prefill chunk's responses came beside a verify
    while len(done) < len(prompts):
        verified = stats.verify_steps if stats else 0
        prompt_responses, generated = gen.next()
        if stats and prompt_responses and stats.verify_steps > verified:
            gen.beside += 1
        steps += 1
        if steps == 3 and late:
            for i, uid in zip(late, gen.insert_segments([[prompts[i]] for i in late])):
                uids[uid] = i
        for r in generated:
            out[uids[r.uid]].append(int(r.token))
            if r.finish_reason is not None:
                done.add(uids[r.uid])
    gen.close()
    return out, uids


def _oracle(replies: dict, prompts: list):
    """Drafts: the plain reply's next tokens, one of them changed (which one moves)."""
    by_prompt = {tuple(p): replies[i] for i, p in enumerate(prompts)}
    calls = [0]

    def script(uid, context, k):
        calls[0] += 1
        for prompt, reply in by_prompt.items():
            n = len(prompt)
            if tuple(context[:n]) == prompt:
                done = len(context) - n
                drafts = list(reply[done : done + k])
                wrong = (calls[0] * 5 + uid) % (k + 2)
                if wrong < len(drafts):
                    drafts[wrong] = (drafts[wrong] + 1) % 4000 + 3
                return drafts
        return []

    return ScriptedDrafts(script)


def _prompts(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 4000, size=int(rng.integers(12, 70))).tolist() for _ in range(n)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_speculation_is_plain_decoding(arch, batch):
    model = build_model(arch)
    prompts = _prompts(batch, seed=batch)
    late = tuple(range(batch // 2, batch)) if batch > 1 else ()
    plain, _ = _run(_chunked(model), prompts, late)
    for k in (1, 4):
        gen = _chunked(model, Speculation(_oracle(plain, prompts), k))
        stats = gen._generation_batch.stats
        spoken, _ = _run(gen, prompts, late)
        assert spoken == plain, (arch, batch, k)
        assert stats.verify_steps > 0
        assert gen.beside > 0 or batch == 1  # prefill chunks interleaved with verify steps
        # Every acceptance length happened: all drafts, some (of more than one), none.
        assert stats.accepted_all and stats.accepted_none and (k == 1 or stats.accepted_some)
    # Prompt lookup on the same prompts: the same tokens again.
    gen = _chunked(model, Speculation(PromptLookup(), None))
    assert _run(gen, prompts, late)[0] == plain


def test_speculation_on_mlx_lm_batches():
    """The padded prefill schedule (`--schedule batched`) speculates the same way."""
    model = build_model("qwen3_next")
    prompts = _prompts(3, seed=5)
    plain, _ = _run(LineageBatchGenerator(model, max_tokens=MAX_TOKENS), prompts)
    gen = LineageBatchGenerator(
        model, max_tokens=MAX_TOKENS, speculation=Speculation(_oracle(plain, prompts), 3)
    )
    assert _run(gen, prompts)[0] == plain
