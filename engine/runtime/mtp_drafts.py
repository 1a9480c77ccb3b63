"""MTP drafts: the model's next-next-token head guessing what follows the token in flight.

The head (engine.runtime.mtp.MTPHead) reads pairs (h_t, token t+1): the main
model's final hidden state at a position and the token that followed it, and
predicts token t+2. In the generation batch that is exactly what a step knows
when it ends: the verify forward gave the hidden states of every position it
fed, the acceptance kept `kept[r]` of them, and the token drawn after the last
kept one is in flight. So after each step every row feeds the head its kept
pairs, the last one pairing its last kept position with the token in flight,
and the head's output there is the first draft for the next step. `chain > 1`
feeds the head its own output and the draft back (the recursive use vLLM and
SGLang make of a one-layer head) for more drafts; those chained positions leave
the head's cache again before the next step.

The head's cache is its one layer's batch cache (a `BatchKVCache`, or a
`CacheList` of them under MLA/DSA) whose rows follow the batch's rows
(`filter`, `extend`): a row's head context is what that sequence decoded in
this batch, from its first token on, never a rejected draft (only kept pairs
are fed; the right padding of rows that kept fewer becomes left padding, as
engine.runtime.rollback does for the main caches). The prompt's positions are
not in it: prefill does not keep the hidden states, and a prompt restored from
the lineage cache never had them computed. The head's context is derived
data: nothing of it is committed to the cache.

It knows the head, its cache and the batch's rows; it knows nothing of
acceptance, samplers or the lineage cache.
"""

from __future__ import annotations

import mlx.core as mx


class MTPDrafts:
    """The head's cache and each row's drafts for the next step (module doc)."""

    def __init__(self, model, head, chain: int = 1):
        self.model, self.head, self.chain = model, head, chain
        self.cache: list | None = None  # [the head's batch cache]; None while the batch has no rows
        self.drafts: list[list[int]] = []  # per row: the head's guesses after the token in flight
        self.steps = 0  # head forwards (kept pairs and chained positions alike)

    # ---- the batch's rows ------------------------------------------------------

    def extend(self, rows: int) -> None:
        """`rows` sequences joined the batch (at its end): no head context yet."""
        if self.cache is None:
            self.cache = [self.head.batch_cache(rows)]
        else:
            self.cache[0].extend(self.head.batch_cache(rows))
        self.drafts.extend([] for _ in range(rows))

    def filter(self, keep: list[int]) -> None:
        if keep:
            self.cache[0].filter(keep)
        else:
            self.cache = None
        self.drafts = [self.drafts[i] for i in keep]

    def proposals(self, wanted: list[int]) -> list[list[int]]:
        """Each row's drafts for this step, at most `wanted[r]` of them."""
        return [d[:k] for d, k in zip(self.drafts, wanted)]

    # ---- after a step ------------------------------------------------------------

    def skipped(self) -> None:
        """A step ran without the head (a plain masked step): its drafts are stale. The
        head's context misses that position, which costs accuracy, never exactness."""
        self.drafts = [[] for _ in self.drafts]

    def advance(self, hidden: mx.array, fed: list[list[int]], kept: list[int], nexts: list[int]):
        """Feed the head each row's kept pairs and draw its drafts for the next step.

        `hidden` [B, L, H]: the verify forward's final hidden states; `fed[r]` the
        tokens it fed row r, of which it kept `kept[r]`; `nexts[r]` the token drawn
        after them (in flight)."""
        longest = max(kept)
        pairs = [row[1:k] + [n] + [0] * (longest - k) for row, k, n in zip(fed, kept, nexts)]
        cache = self.cache[0]
        padding = [longest - k for k in kept]
        if any(padding):
            cache.prepare(right_padding=padding)
        out = self.head(
            hidden[:, :longest], mx.array(pairs), self.model.model.embed_tokens, self.cache
        )
        if any(padding):
            cache.finalize()
        last = out[mx.arange(len(kept)), mx.array(kept) - 1][:, None]  # [B, 1, H]
        drafts = [mx.argmax(self.head.logits(self.model, last)[:, -1], axis=-1)]
        for _ in range(self.chain - 1):  # the head's own output and draft, fed back
            last = self.head(last, drafts[-1][:, None], self.model.model.embed_tokens, self.cache)
            drafts.append(mx.argmax(self.head.logits(self.model, last)[:, -1], axis=-1))
        self.steps += self.chain
        self.drafts = mx.stack(drafts, axis=1).tolist()
        if self.chain > 1:
            cache.trim(self.chain - 1)  # the chained positions were guesses
