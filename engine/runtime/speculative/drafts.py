"""Draft sources: the tokens a sequence is guessed to say next, before the model says them.

A source proposes up to `k` tokens that follow a sequence's context (its
prompt, the session's earlier replies that the prompt carries, and what it has
generated so far); the verify forward (engine.runtime.speculative.speculative_batch)
decides which of them the model agrees with. A source is never trusted: a bad
guess costs the verify forward's extra positions and nothing else.

- `PromptLookup`: n-gram matching against the sequence's own context (vLLM's
  ngram proposer, llama.cpp's lookup decoding). An agent that re-emits a file
  with a few lines changed, or quotes what it read, says text that is already
  there: the longest recent n-gram that ends the context is found earlier, and
  what followed it there is the draft. Its index is kept per sequence and
  extended as tokens come, so a step costs a few dict lookups.
- `ScriptedDrafts`: a fixed proposal per sequence, from a callable: what the
  tests use to force every acceptance length.

It knows token ids and nothing of MLX, the batch or the model.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

MIN_NGRAM = 2  # a single-token match drafts too often on free text to pay
MAX_NGRAM = 4


class DraftSource(Protocol):
    """What the speculative batch asks of a draft source."""

    def propose(self, uid: int, context: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens guessed to follow `context` (the sequence's whole context, its
        last token included); [] when it has no guess."""
        ...

    def forget(self, uid: int) -> None:
        """The sequence left the batch."""
        ...


class NgramIndex:
    """The n-grams of one sequence's context, each mapped to where it last ended.

    Only n-grams that end before the context's last token are indexed, so the
    n-gram that ends the context looks up its previous occurrence, not itself.
    """

    def __init__(self, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM):
        self.min_n, self.max_n = min_n, max_n
        self.ends: dict[tuple, int] = {}
        self.indexed = 0  # n-grams ending before this position are in `ends`

    def extend(self, context: Sequence[int]) -> None:
        """Index the n-grams that end before the context's last token."""
        last = len(context) - 1
        if last < self.indexed:  # the context is shorter than what was indexed: start again
            self.ends.clear()
            self.indexed = 0
        for end in range(self.indexed, last):
            for n in range(self.min_n, self.max_n + 1):
                if end + 1 >= n:
                    self.ends[tuple(context[end + 1 - n : end + 1])] = end
        self.indexed = max(self.indexed, last)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """What followed the longest n-gram that ends `context`, where it last occurred."""
        self.extend(context)
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(context) < n:
                continue
            end = self.ends.get(tuple(context[len(context) - n :]))
            if end is not None:
                return list(context[end + 1 : end + 1 + k])
        return []


class PromptLookup:
    """Prompt-lookup drafts: n-gram matches against each sequence's own context."""

    def __init__(self, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM):
        self.min_n, self.max_n = min_n, max_n
        self.indexes: dict[int, NgramIndex] = {}

    def propose(self, uid: int, context: Sequence[int], k: int) -> list[int]:
        index = self.indexes.get(uid)
        if index is None:
            index = self.indexes[uid] = NgramIndex(self.min_n, self.max_n)
        return index.propose(context, k) if k > 0 else []

    def forget(self, uid: int) -> None:
        self.indexes.pop(uid, None)


class ScriptedDrafts:
    """Drafts from `script(uid, context, k)`: a test's way to force each acceptance length."""

    def __init__(self, script: Callable[[int, Sequence[int], int], list[int]]):
        self.script = script

    def propose(self, uid: int, context: Sequence[int], k: int) -> list[int]:
        return list(self.script(uid, context, k))[:k]

    def forget(self, uid: int) -> None:
        pass
