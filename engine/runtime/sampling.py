"""Per-request samplers.

A sampler maps a row of log-probabilities to a token. A seeded request owns its
own PRNG key, so its output does not depend on what else is in the batch.
Speculative verification (engine.runtime.speculative.verification) reads the same
sampler's target distribution (`logits`) and draws from its key (`split`), so
a request samples from one distribution whether or not its drafts are
verified.

mlx-lm's filters are `mx.compile`d, and a compiled function keeps one graph per
distinct value of each argument that is not an array, for the life of the
process: fed each request's `top_p` as a float, a server whose clients send
their own top-p values would grow by a graph per value ever seen. So top-p
reaches the compiled filter as an array (one graph for all values), and top-k,
whose `k` is a shape (the partition's kth, a slice), runs uncompiled: a
partition and a scatter, nothing for the compiler to fuse.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p

from engine.runtime.requests import SamplingParams


class RequestSampler:
    """Temperature, top-k and top-p sampling for one request, with its own key if seeded."""

    def __init__(self, params: SamplingParams, vocab_size: int):
        self.key = mx.random.key(params.seed) if params.seed is not None else None
        self.inv_temp = 1.0 / params.temperature
        self.top_k = params.top_k if 0 < params.top_k < vocab_size else 0
        self.top_p = params.top_p if 0 < params.top_p < 1 else 0.0

    def logits(self, logprobs: mx.array) -> mx.array:
        """The logits this request samples from (top-k, top-p, temperature applied)."""
        x = logprobs
        if self.top_k:
            x = top_k_filter(x, self.top_k)
        if self.top_p:  # an array, not a float: a traced input of the compiled filter
            x = apply_top_p(x, mx.array(self.top_p, dtype=mx.float32))
        return x * self.inv_temp

    def split(self):
        """A key for one draw: the request's own stream if seeded, else MLX's global one."""
        if self.key is None:
            return None
        self.key, sub = mx.random.split(self.key)
        return sub

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.random.categorical(self.logits(logprobs), key=self.split())


def top_k_filter(logprobs: mx.array, k: int) -> mx.array:
    """`logprobs` with all but the `k` largest of each row at -inf: mlx-lm's `apply_top_k`,
    uncompiled (module doc)."""
    dropped = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[..., k:]
    return mx.put_along_axis(logprobs, dropped, mx.array(-float("inf"), logprobs.dtype), axis=-1)


def make_sampler(params: SamplingParams, vocab_size: int):
    """A sampler for one request; None means greedy (the batch's shared argmax)."""
    if params.temperature == 0:
        return None
    return RequestSampler(params, vocab_size)


def greedy(logprobs: mx.array) -> mx.array:
    """The batch's own default sampler (mlx-lm's: argmax), where a request has none."""
    return mx.argmax(logprobs, axis=-1)
