"""Each sampled token's log-probability, and the most likely tokens at its position.

The row a token was sampled from is the batch's log-softmax of the model's
logits (before temperature, top-p and top-k: the model's own distribution);
for a constrained sequence it is the row after the grammar's mask,
renormalised over the allowed tokens (engine.runtime.structured.masked_batch), so a
token the grammar forbids never shows up. One request's positions are read on
the host only when it asked (`SamplingParams.logprobs`): a top-k of one row.
"""

from __future__ import annotations

import math

import mlx.core as mx

from engine.runtime.events import TokenLogprobs, Tokens


def token_logprobs(row: mx.array, token: int, top: int = 0) -> TokenLogprobs:
    """`token`'s log-probability in `row` (V,), and the `top` most likely tokens, most
    likely first (-inf, a masked token, is never among them)."""
    row = row.reshape(-1)
    if top <= 0:
        return TokenLogprobs(logprob=_finite(row[token].item()))
    ids = mx.argpartition(-row, kth=top - 1)[:top]
    values = row[ids]
    order = mx.argsort(-values)
    ids, values = ids[order].tolist(), values[order].tolist()
    pairs = tuple((int(i), _finite(v)) for i, v in zip(ids, values) if v != -math.inf)
    return TokenLogprobs(logprob=_finite(row[token].item()), top=pairs)


def _finite(value: float) -> float:
    """JSON carries no -inf: a masked token's log-probability is the lowest finite float."""
    return value if math.isfinite(value) else -3.4e38


def tokens_event(act, token: int, row: mx.array) -> Tokens:
    """The Tokens event of one sampled token of `act` (an ActiveRequest), with its
    log-probabilities read from `row` when the request asked."""
    sampling = act.req.sampling
    if not sampling.logprobs:
        return Tokens(ids=(token,), text="", index=act.index)
    lp = token_logprobs(row, token, sampling.top_logprobs)
    return Tokens(ids=(token,), text="", logprobs=(lp,), index=act.index)
