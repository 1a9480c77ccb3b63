"""Drafts of grammar-constrained rows: cut to what the matcher allows, verified under its masks.

A constrained row's matcher (engine.runtime.structured.matcher) follows the masked
batch's protocol (engine.runtime.structured.masked_batch): at the start of a step it
holds every token the row has kept, and not the token in flight (sampled last
step, fed this one), which the step accepts. Speculation keeps that protocol:

1. Before the verify forward, `allowed` cuts a row's drafts to the prefix the
   grammar accepts after the token in flight (`Matcher.validate`), leaving
   the matcher as it was: drafts the grammar refuses are never fed.
2. While the forward runs, `walk` advances each constrained row's matcher
   through its token in flight and its drafts, taking the bitmask before each
   (k + 1 masks for k drafts: the position after the current token and after
   each draft), and masks those positions' log-probabilities: all the
   constrained rows' positions in one `mask_rows`, scattered back into the
   batch's. A draft the mask refuses (a stop token `validate` let by, say) is
   cut there. Acceptance (greedy exact match, rejection sampling) then reads
   the masked log-probabilities, so the kept tokens and the token drawn after
   them are the ones masked plain decoding draws, and the reported logprobs are
   the masked ones.
3. After acceptance, `Walk.settle` rolls each matcher back to the tokens its
   row kept: the token drawn after them is in flight, accepted next step.

It knows the Matcher interface and the masked batch's `mask_rows`; nothing
of caches, draft sources or acceptance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from engine.runtime.structured.masked_batch import mask_rows


def allowed(matcher, current: int, drafts: list[int]) -> int:
    """How many leading `drafts` the row's grammar allows after its token in flight
    `current`; the matcher is left holding what it held."""
    if not drafts or matcher.stopped():
        return 0
    if not matcher.accept(current):
        return 0  # refused (never, once masked): the plain step reports it
    n = matcher.validate(drafts)
    matcher.rollback(1)
    return n


def _has(words: np.ndarray, token: int) -> bool:
    return bool((int(words.view(np.uint32)[token // 32]) >> (token % 32)) & 1)


@dataclass(frozen=True)
class Walk:
    """The constrained rows of one verify: each matcher and how many tokens it advanced."""

    held: tuple  # (row, Matcher, tokens accepted this step)
    ms: float  # the walk's time: accepts, masks, the masking dispatched

    def settle(self, kept: list[int]) -> float:
        """Roll each matcher back to its row's kept tokens (`kept[row]`); the walk's and
        the rollbacks' ms."""
        tic = time.perf_counter()
        for r, matcher, advanced in self.held:
            matcher.rollback(advanced - kept[r])
        return self.ms + (time.perf_counter() - tic) * 1000


def walk(logits: mx.array, logprobs: mx.array, rows: list, current: list[int], drafts: list):
    """(log-probabilities with every constrained row's positions masked, the Walk), or
    (`logprobs`, None) without constrained rows (`rows`: (row, Matcher) pairs, the batch's
    `matcher_rows()`). `logits` and `logprobs` are the verify forward's (rows, fed, V); a
    row's drafts the grammar refuses are cut in place."""
    if not rows:
        return logprobs, None
    mx.async_eval(logits)  # the forward runs while the matchers work
    tic = time.perf_counter()
    n_rows, fed, vocab = logits.shape
    where, words, held = [], [], []
    for r, c in rows:
        d = drafts[r]
        advanced = 1 if c.accept(current[r]) else 0
        for i in range(len(d) + 1):
            bits = c.mask()  # None once the end is accepted: the row ends there
            if bits is not None:
                where.append(r * fed + i)
                words.append(bits)
            if i == len(d):
                break
            if bits is None or not _has(bits, d[i]) or not c.accept(d[i]):
                del d[i:]  # the grammar refuses it: never accepted
                break
            advanced += 1
        held.append((r, c, advanced))
    if where:
        flat = logits.reshape(n_rows * fed, vocab)
        picked = mask_rows(flat, where, np.stack(words))
        logprobs = logprobs.reshape(n_rows * fed, vocab)
        logprobs[mx.array(where)] = picked.astype(logprobs.dtype)
        logprobs = logprobs.reshape(n_rows, fed, vocab)
    return logprobs, Walk(tuple(held), (time.perf_counter() - tic) * 1000)
