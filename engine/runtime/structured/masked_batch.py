"""mlx-lm's GenerationBatch with grammar-constrained rows, each masked on its own.

A constrained sequence's `Matcher` (engine.runtime.structured.matcher) is kept by
its uid (`matchers`, one dict the batch generator shares with its batches): mlx-lm
moves a row's uid with the row through every split, filter and extend of the
prompt and generation batches, so the matcher follows its sequence wherever the
batch puts it, and leaves with it when the row leaves the generation batch.

A step with constrained rows:
1. the forward is dispatched (`mx.async_eval`): the model computes while
2. the tokens fed this step reach the host (they were sampled last step), each
   constrained row's matcher accepts its token and fills its bitmask;
3. the constrained rows alone are masked (`mask_rows`: gathered, the bitmasks
   unpacked in MLX, one `where` and the renormalisation, compiled: at a large
   vocabulary a whole-batch op costs many times one row's) and each is
   sampled with its own sampler; unconstrained rows are sampled as mlx-lm
   does, untouched.
The row's log-probabilities kept for the next step (and reported as logprobs)
are the masked ones. A step without constrained rows is mlx-lm's own.

A sequence's first step in the batch feeds its prompt's last token (or, for a
resend, the first token already accepted at admission): no matcher accepts
what the batch's constructor feeds. The prompt end's log-probabilities that the
lineage cache keeps (a verbatim resend samples from them) are the model's, not
one request's masked ones: `unmasked` holds them for the constrained rows,
until the generator reads them (`LineageBatchGenerator.generation_logprobs`) or
the row leaves.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.generate import GenerationBatch


@mx.compile
def _held(logits: mx.array, words: mx.array) -> mx.array:
    # (the shifts are made here: an array made at import belongs to the importing
    # thread's stream, and the model loop runs on its own)
    bits = (words[:, :, None] >> mx.arange(32, dtype=mx.int32)) & 1
    allowed = bits.reshape(words.shape[0], -1)[:, : logits.shape[-1]].astype(mx.bool_)
    rows = mx.where(allowed, logits, -mx.inf)
    return rows - mx.logsumexp(rows, axis=-1, keepdims=True)


def mask_rows(logits: mx.array, rows: list[int], words: np.ndarray) -> mx.array:
    """Log-probabilities of the batch's `rows` (k, V), the tokens outside each row's bitmask
    (`words`: int32, (k, V/32), numpy) at -inf, renormalised over the allowed ones: one
    gather and one op for all of them, never the other rows."""
    picked = logits if rows == list(range(logits.shape[0])) else logits[mx.array(rows)]
    return _held(picked, mx.array(words))


def mask_row(logits: mx.array, words: np.ndarray) -> mx.array:
    """`mask_rows` of a single row (1, V) and its bitmask (V/32,)."""
    return _held(logits, mx.array(words)[None])


class LineageGenerationBatch(GenerationBatch):
    """GenerationBatch whose constrained rows are masked per row (module doc)."""

    def __init__(self, *args, matchers: dict | None = None, **kwargs):
        self._fed = False  # the constructor's step feeds the rows' last prompt tokens
        self.unmasked: dict = {}  # uid -> its prompt end's log-probabilities, unmasked
        # uid -> its Matcher, for the constrained sequences (the batch generator's, shared)
        self.matchers: dict = {} if matchers is None else matchers
        super().__init__(*args, **kwargs)
        self._fed = True

    def matcher_rows(self) -> list:
        """(row, Matcher) of every constrained row, in row order."""
        return [(e, m) for e, uid in enumerate(self.uids) if (m := self.matchers.get(uid))]

    def extend(self, batch):
        super().extend(batch)
        self.unmasked.update(getattr(batch, "unmasked", {}))

    def filter(self, keep):
        left = set(self.uids)
        super().filter(keep)
        kept = set(self.uids)
        self.unmasked = {u: lp for u, lp in self.unmasked.items() if u in kept}
        for uid in left - kept:  # a sequence leaves the generation batch at its end
            self.matchers.pop(uid, None)

    def _step(self):
        rows = self.matcher_rows()
        if not rows:
            return super()._step()
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        mx.async_eval(logits)  # the forward runs while the matchers work
        if self._fed:
            fed = inputs.tolist()
            for e, c in rows:
                c.accept(fed[e])
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        held = [(e, w) for e, c in rows if (w := c.mask()) is not None]
        masked = {}
        if held:
            picked = mask_rows(logits, [e for e, _ in held], np.stack([w for _, w in held]))
            masked = {e: picked[j : j + 1] for j, (e, _) in enumerate(held)}
        samplers = [
            self.fallback_sampler if s is None else s
            for s in (self.samplers or [None] * len(self.uids))
        ]
        if all(s is samplers[0] for s in samplers):  # the shared (greedy) sampler
            sampled = samplers[0](logprobs)
            if held:
                sampled[mx.array([e for e, _ in held])] = samplers[0](picked)
        else:
            sampled = mx.concatenate(
                [s(masked.get(e, logprobs[e : e + 1])) for e, s in enumerate(samplers)], axis=0
            )
        self._next_tokens = sampled
        self._next_logprobs = list(logprobs)
        for e, lp in masked.items():
            if not self._fed:
                self.unmasked[self.uids[e]] = self._next_logprobs[e]
            self._next_logprobs[e] = lp[0]
        mx.async_eval(self._next_tokens, self._next_logprobs)
        mx.eval(inputs, self._current_logprobs)
        inputs = inputs.tolist()
        for sti, ti in zip(self.tokens, inputs):
            sti.append(ti)
        return inputs, self._current_logprobs


def sample_first(logits: mx.array, sampler, matcher) -> tuple[int, mx.array]:
    """A resend's first token, sampled at admission from the kept log-probabilities (V,),
    held to its grammar like every later token; and the row it was sampled from."""
    row = logits[None]
    if matcher is not None:
        row = mask_row(row, matcher.mask())
    first = int(sampler(row)[0].item())
    if matcher is not None:
        matcher.accept(first)
    return first, row
