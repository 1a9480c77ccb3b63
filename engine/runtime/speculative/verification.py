"""Which drafts a verify forward accepts, and the token that follows them.

A verify forward gives row r the log-probabilities at each of its fed
positions: position i is the model's distribution for the token after the
current token and the first i drafts. Then, per row:

- greedy (no sampler): drafts are accepted while each equals the argmax at
  its position; the next token is the argmax after the last accepted one.
  Output is token for token what plain greedy decoding gives.
- temperature > 0: speculative sampling (Leviathan et al. 2023, Chen et al.
  2023). Draft i is accepted with probability min(1, p(d)/q(d)), where p is
  the request's own target distribution (its sampler's top-k, top-p and
  temperature) and q the draft's; a prompt-lookup draft is certain (q is one
  at d), so it is accepted with probability p(d). At the first rejection the
  next token is drawn from the residual max(p - q, 0), renormalized; when
  every draft is accepted it is drawn from p at the position after them.
  Each emitted token is then distributed exactly as plain sampling's.

It knows MLX arrays and the request's sampler; nothing of caches or the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class Verdict:
    """One row's outcome: how many drafts it accepted, and the token drawn after them."""

    accepted: int
    next_token: int


def greedy(targets: list[int], drafts: list[int]) -> Verdict:
    """Exact match against the argmax at each position (`targets`, one per fed position)."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return Verdict(accepted, targets[accepted])


def sample(sampler, logprobs: mx.array, drafts: list[int], draft_probs=None) -> Verdict:
    """Speculative sampling of one row: `logprobs` [fed, V]; `draft_probs` [len(drafts), V]
    the draft source's distributions, or None for certain drafts (prompt lookup)."""
    k = len(drafts)
    logits = sampler.logits(logprobs[: k + 1])
    p = mx.softmax(logits.astype(mx.float32), axis=-1)
    if k:
        index = mx.array(drafts)[:, None]
        p_d = mx.take_along_axis(p[:k], index, axis=-1)[:, 0]
        if draft_probs is None:
            ratio = p_d
        else:
            q_d = mx.take_along_axis(draft_probs, index, axis=-1)[:, 0]
            ratio = mx.minimum(1.0, p_d / mx.maximum(q_d, 1e-30))
        u = mx.random.uniform(shape=(k,), key=sampler.split())
        accepts = (u < ratio).tolist()
    else:
        accepts = []
    accepted = 0
    while accepted < k and accepts[accepted]:
        accepted += 1
    if accepted == k:
        token = mx.random.categorical(logits[k], key=sampler.split())
        return Verdict(k, int(token.item()))
    # The residual: p less the draft's distribution, renormalized (categorical does that).
    if draft_probs is None:
        residual = p[accepted] * (mx.arange(p.shape[-1]) != drafts[accepted])
    else:
        residual = mx.maximum(p[accepted] - draft_probs[accepted], 0.0)
    token = mx.random.categorical(mx.log(residual), key=sampler.split())
    return Verdict(accepted, int(token.item()))
