"""At temperature > 0, speculative sampling draws each token from the request's own
distribution: chi-square tests over a small vocabulary, fixed seeds.

`verification.sample` against the exact target: the first emitted token (the
draft if accepted, else the residual's draw) and the second (given the first
draft was accepted) must each follow the sampler's distribution at their
position, for a certain draft (prompt lookup) and for a draft with a
distribution of its own. Then the engine end to end: the first three tokens
of many seeded requests, plain and speculating, with top-k 3 (27 cells), must
not tell the two apart.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from engine.runtime.batching.batch import LineageBatchGenerator
from engine.runtime.model.tiny_models import build_model
from engine.runtime.requests import SamplingParams
from engine.runtime.sampling import make_sampler
from engine.runtime.speculative import verification
from engine.runtime.speculative.drafts import ScriptedDrafts
from engine.runtime.speculative.speculative_batch import Speculation

V = 8
TRIALS = 4000
# Chi-square critical values at p = 0.001 (df = cells - 1): a true test fails 1 in 1000.
CRITICAL = {7: 24.32, 26: 54.05}


def _chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def _target(seed: int) -> mx.array:
    logits = mx.array(np.random.default_rng(seed).normal(size=(3, V)) * 1.5, dtype=mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _run_sampling(draft_probs) -> tuple[np.ndarray, np.ndarray, int]:
    logprobs = _target(0)
    sampler = make_sampler(SamplingParams(max_tokens=8, temperature=1.0, seed=11), V)
    rng = np.random.default_rng(3)
    first = np.zeros(V)
    second = np.zeros(V)
    both = 0
    for _ in range(TRIALS):
        # A certain draft is fixed; a draft with a distribution is drawn from it.
        q = None if draft_probs is None else np.asarray(draft_probs)
        drafts = [2, 5] if q is None else [int(rng.choice(V, p=q[i] / q[i].sum())) for i in (0, 1)]
        verdict = verification.sample(sampler, logprobs, drafts, draft_probs)
        emitted = drafts[: verdict.accepted] + [verdict.next_token]
        first[emitted[0]] += 1
        if verdict.accepted >= 1:
            second[emitted[1]] += 1
            both += 1
    return first, second, both


def _check(first, second, both):
    p = np.asarray(mx.softmax(_target(0), axis=-1))
    assert _chi_square(first, p[0] * TRIALS) < CRITICAL[7]
    assert both > 300  # enough draws given the first draft was accepted
    assert _chi_square(second, p[1] * both) < CRITICAL[7]


def test_certain_drafts_keep_the_target_distribution():
    _check(*_run_sampling(None))


def test_drafts_with_their_own_distribution_keep_the_target_distribution():
    q = np.random.default_rng(5).dirichlet(np.ones(V), size=2).astype(np.float32)
    _check(*_run_sampling(mx.array(q)))


def _first_tokens(model, speculation, seeds, n=3) -> list[tuple]:
    """The first `n` tokens of one request per seed (top-k 3, temperature 1), 8 at a time."""
    out = []
    prompt = list(range(40, 70))
    for start in range(0, len(seeds), 8):
        gen = LineageBatchGenerator(model, max_tokens=n, speculation=speculation)
        chunk = seeds[start : start + 8]
        samplers = [
            make_sampler(SamplingParams(max_tokens=n, temperature=1.0, top_k=3, seed=s), 4096)
            for s in chunk
        ]
        uids = gen.insert_segments([[prompt]] * len(chunk), samplers=samplers)
        got = {u: [] for u in uids}
        while any(len(v) < n for v in got.values()):
            for r in gen.next()[1]:
                got[r.uid].append(int(r.token))
        gen.close()
        out += [tuple(got[u]) for u in uids]
    return out


def test_speculating_engine_samples_like_plain_decoding():
    model = build_model("qwen3_next")
    seeds = list(range(1000, 1000 + 480))
    plain = _first_tokens(model, None, seeds)
    # Drafts: at every prefix, the plain run's most frequent next tokens, so every row
    # drafts at every step and its drafts are often accepted and often not.
    following: dict = {}
    for tokens in plain:
        for i in range(len(tokens)):
            following.setdefault(tokens[:i], []).append(tokens[i])
    mode = {prefix: max(set(nexts), key=nexts.count) for prefix, nexts in following.items()}
    prompt_len = 30

    def script(uid, context, k):
        done = tuple(context[prompt_len:])
        drafts = []
        while len(drafts) < k and done in mode:
            drafts.append(mode[done])
            done = done + (mode[done],)
        return drafts

    spec = _first_tokens(model, Speculation(ScriptedDrafts(script), 2), [s + 7 for s in seeds])
    cells = sorted(set(plain) | set(spec))
    a = np.array([plain.count(c) for c in cells], dtype=float)
    b = np.array([spec.count(c) for c in cells], dtype=float)
    # Two samples of equal size: chi-square of the contingency table.
    total = a + b
    keep = total > 0
    statistic = float((((a - b) ** 2)[keep] / total[keep]).sum())
    assert len(cells) <= 27
    assert statistic < CRITICAL[26], (statistic, len(cells))
