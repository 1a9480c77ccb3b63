"""Per-request samplers.

A sampler maps a row of log-probabilities to a token. A seeded request owns its
own PRNG key, so its output does not depend on what else is in the batch.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p

from engine.runtime.requests import SamplingParams


def make_sampler(params: SamplingParams, vocab_size: int):
    """A sampler for one request; None means greedy (the batch's shared argmax)."""
    if params.temperature == 0:
        return None
    key = [mx.random.key(params.seed)] if params.seed is not None else None
    inv_temp = 1.0 / params.temperature
    top_k = params.top_k if 0 < params.top_k < vocab_size else 0
    top_p = params.top_p if 0 < params.top_p < 1 else 0.0

    def sample(logprobs: mx.array) -> mx.array:
        x = logprobs
        if top_k:
            x = apply_top_k(x, top_k)
        if top_p:
            x = apply_top_p(x, top_p)
        if key is None:
            return mx.random.categorical(x * inv_temp)
        key[0], sub = mx.random.split(key[0])
        return mx.random.categorical(x * inv_temp, key=sub)

    return sample
