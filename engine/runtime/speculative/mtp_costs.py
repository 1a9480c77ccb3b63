"""Whether a model's MTP head pays on this machine: what `--speculative auto` asks at load.

A step with the head's draft feeds two tokens instead of one, runs the head's
one layer after it and, when the draft is rejected (1 - rate of the time), a
rollback's replay; it emits 1 + rate tokens. It pays when that is more tokens
per millisecond than a plain step:

    (1 + rate) / (verify + head + (1 - rate) * replay) > 1 / plain

On a large model the head is one layer of dozens and a forward's fixed cost
dominates, so it pays; on the embedded model on a CPU (4 layers, the head a
fifth of the work, each token costing nearly its own forward) it does not
(docs/benchmarks.md, "Speculative decoding"). `measure` times the three
forwards once at load on a short synthetic context; the rate is the prior
`RATE`, the embedded head's acceptance on the benchmark's traffics.

It knows forwards and milliseconds; it keeps nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, RotatingKVCache

from engine.runtime.speculative.mtp import lm_logits

RATE = 0.6  # the embedded head's acceptance on edit, tool-call and chat traffic (0.59-0.63)
CONTEXT = 64  # tokens of synthetic context the forwards are timed on
REPEATS = 7


@dataclass(frozen=True)
class HeadCosts:
    """Milliseconds of a plain step, a two-token verify, the head, and a rollback's replay."""

    plain_ms: float
    verify_ms: float
    head_ms: float
    replay_ms: float

    def pays(self, rate: float = RATE) -> bool:
        spent = self.verify_ms + self.head_ms + (1 - rate) * self.replay_ms
        return (1 + rate) / spent > 1 / self.plain_ms


def _median_ms(fn) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(REPEATS):
        tic = time.perf_counter()
        fn()
        times.append((time.perf_counter() - tic) * 1000)
    return sorted(times)[len(times) // 2]


def measure(model, head) -> HeadCosts:
    """Time the forwards on one sequence of CONTEXT tokens (the KV grows a few rows a call,
    which changes nothing measurable). The replay is charged a plain step where the model
    has state layers (a rollback then replays; its mixers alone cost less), else nothing."""
    cache = model.make_cache()
    tokens = mx.arange(3, 3 + CONTEXT)[None] % model.args.vocab_size
    hidden = model.model(tokens, cache=cache)
    mx.eval(hidden)
    head_cache = head.make_cache()
    one, two = tokens[:, :1], tokens[:, :2]

    def plain():
        mx.eval(model(one, cache=cache))

    def verify():
        h = model.model(two, cache=cache)
        mx.eval(lm_logits(model, h))  # the trunk's hidden states and their logits

    def drafts():
        x = head(hidden[:, -1:], one, model.model.embed_tokens, head_cache)
        mx.eval(mx.argmax(head.logits(model, x), axis=-1))

    plain_ms = _median_ms(plain)
    state = any(isinstance(c, (ArraysCache, RotatingKVCache)) for c in model.make_cache())
    return HeadCosts(
        plain_ms=plain_ms,
        verify_ms=_median_ms(verify),
        head_ms=_median_ms(drafts),
        replay_ms=plain_ms if state else 0.0,
    )
