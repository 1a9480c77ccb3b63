"""Request samplers: the top-k and top-p filters keep one compiled graph whatever values
the requests bring, and filter as mlx-lm's do."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import mlx_lm.sample_utils as sample_utils
import numpy as np

from engine.runtime.requests import SamplingParams
from engine.runtime.sampling import make_sampler


class CountingMx:
    """mlx.core as mlx-lm's sampling module sees it, counting the names it looks up: a
    compiled function's body runs (looks them up) only when it is traced anew."""

    def __init__(self):
        self.looked_up: Counter = Counter()

    def __getattr__(self, name):
        self.looked_up[name] += 1
        return getattr(mx, name)


def log_probs(seed: int) -> mx.array:
    x = mx.random.normal((1, 512), key=mx.random.key(seed))
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def test_distinct_top_p_and_top_k_values_trace_no_new_graph(monkeypatch):
    counting = CountingMx()
    monkeypatch.setattr(sample_utils, "mx", counting)
    logprobs = log_probs(0)
    for i in range(12):
        params = SamplingParams(1, temperature=0.7, top_p=0.5 + i / 40, top_k=3 + i, seed=i)
        mx.eval(make_sampler(params, 512).logits(logprobs))
    # top-p: traced at most once (an earlier test may have traced it at this shape);
    # top-k: mlx-lm's compiled filter never used
    assert counting.looked_up["sort"] <= 1 and counting.looked_up["argpartition"] == 0


def test_filters_keep_what_mlx_lm_keeps():
    logprobs = log_probs(1)
    for top_p, top_k in ((0.9, 0), (0.0, 7), (0.6, 40)):
        params = SamplingParams(1, temperature=0.5, top_p=top_p, top_k=top_k)
        want = logprobs
        if top_k:
            want = sample_utils.apply_top_k(want, top_k)
        if top_p:
            want = sample_utils.apply_top_p(want, top_p)
        got = make_sampler(params, 512).logits(logprobs)
        assert np.array_equal(np.array(got), np.array(want * 2.0))
