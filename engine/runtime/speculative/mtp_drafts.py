"""MTP drafts: the model's next-next-token head guessing what follows the token in flight.

The head (engine.runtime.speculative.mtp.MTPHead) reads pairs (h_t, token t+1): the main
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
(`filter`, `extend`), never holding a rejected draft (only kept pairs are fed;
the right padding of rows that kept fewer becomes left padding, as
engine.runtime.speculative.rollback does for the main caches). A sequence's head context
starts with its prompt's last `TAIL` prefilled positions (`PromptTails`: the
prefill keeps the trunk's final hidden states of each chunk's positions
instead of its logits, which nothing reads), fed to the head when the
sequence joins the batch; a prefix restored from the lineage cache was never
computed, so it is not there. The prompt's very last position is fed by
mlx-lm's first decode step, which keeps no hidden state: the head skips that
one pair and its rope offset steps over it, so positions stay true. The head's
context is derived data: nothing of it is committed to the cache.

It knows the head, its cache and the batch's rows; it knows nothing of
acceptance, samplers or the lineage cache.
"""

from __future__ import annotations

import mlx.core as mx

TAIL = 256  # prompt positions a sequence's head context starts with


class MTPDrafts:
    """The head's cache and each row's drafts for the next step (module doc)."""

    def __init__(self, model, head, chain: int = 1):
        self.model, self.head, self.chain = model, head, chain
        self.cache: list | None = None  # [the head's batch cache]; None while the batch has no rows
        self.drafts: list[list[int]] = []  # per row: the head's guesses after the token in flight
        self.tails = PromptTails()  # filled by the prompt batches' prefill

    # ---- the batch's rows ------------------------------------------------------

    def extend(self, uids: list[int], tokens: list[list[int]]) -> None:
        """Sequences `uids` joined the batch (at its end), `tokens[i]` what each has fed: the
        head reads each one's prompt tail (module doc); a sequence without one starts empty."""
        tails = [self.tails.pop(uid) for uid in uids]
        joined = self.head.batch_cache(len(uids))
        if any(tails):
            self._read_tails(joined, tails, [t[-1] for t in tokens])
        if self.cache is None:
            self.cache = [joined]
        else:
            self.cache[0].extend(joined)
        self.drafts.extend([] for _ in uids)

    def _read_tails(self, cache, tails: list, last: list[int]) -> None:
        """Feed the head each tail's pairs (its positions' hidden states, each with the token
        after it: the tail's next one, the token fed after the prefill for its last)."""
        longest = max(len(t[1]) if t else 0 for t in tails)
        like = next(t[0] for t in tails if t)
        hidden, pairs, padding = [], [], []
        for tail, token in zip(tails, last):
            n = len(tail[1]) if tail else 0
            h = tail[0] if tail else mx.zeros((0, like.shape[-1]), dtype=like.dtype)
            hidden.append(mx.pad(h, [(0, longest - n), (0, 0)]) if n < longest else h)
            pairs.append((tail[1][1:] + [token] if tail else []) + [0] * (longest - n))
            padding.append(longest - n)
        if any(padding):
            cache.prepare(right_padding=padding)
        self.head(mx.stack(hidden), mx.array(pairs), self.model.model.embed_tokens, [cache])
        if any(padding):
            cache.finalize()
        _step_offsets(cache, [0 if p == longest else 1 for p in padding])
        mx.eval(_states(cache))

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
        self.drafts = mx.stack(drafts, axis=1).tolist()
        if self.chain > 1:
            cache.trim(self.chain - 1)  # the chained positions were guesses


class PromptTails:
    """Each prefilling sequence's last `size` prefilled positions: the trunk's final hidden
    states and their tokens, from its chunks, until it joins the generation batch.

    Written by the prefill (on the prefill worker's thread, for a cohort nobody else
    touches), read once when the sequence joins the batch; a sequence removed before
    that is forgotten by the batch generator."""

    def __init__(self, size: int = TAIL):
        self.size = size
        self.rows: dict[int, tuple] = {}  # uid -> (hidden [n, H], tokens)

    def keep(self, uids, hidden: mx.array, tokens: mx.array, lengths, done: int) -> list:
        """After a chunk of a prompt batch: `hidden` [B, n, H] of `tokens` [B, n], rows
        right-padded (row r has `lengths[r]` prompt tokens, `done` of them before this
        chunk). Returns the arrays to evaluate with the chunk."""
        n = hidden.shape[1]
        ids = tokens.tolist()
        kept = []
        for r, uid in enumerate(uids):
            real = max(0, min(n, lengths[r] - done))
            if real == 0:
                continue
            h, t = hidden[r, max(0, real - self.size) : real], ids[r][:real]
            old = self.rows.get(uid)
            if old is not None and len(t) < self.size:
                h, t = mx.concatenate([old[0], h]), old[1] + t
            h = mx.contiguous(h[-self.size :])  # not a view holding the chunk's states
            self.rows[uid] = (h, t[-self.size :])
            kept.append(h)
        return kept

    def pop(self, uid: int):
        return self.rows.pop(uid, None)


def _step_offsets(cache, steps: list[int]) -> None:
    """Advance each row's rope offset by `steps[r]` (a position the head did not read)."""
    for c in cache.caches if hasattr(cache, "caches") else (cache,):
        c.offset = c.offset + mx.array(steps)


def _states(cache) -> list:
    return [c.state for c in (cache.caches if hasattr(cache, "caches") else (cache,))]
