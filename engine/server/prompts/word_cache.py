"""The tokenizer's word cache in the front end: small, and emptied now and then.

A `tokenizers` BPE model remembers the merges of each word it has encoded (a
word: one piece of the pre-tokenizer's split, such as ` self` or `123456`), up
to 10,000 words, and never forgets one: it keeps the first words it meets and
stops adding when full. In a long-running front end that is ~4 MiB (~400 bytes
a word) that grows as long as new words come, a long prompt of words nobody
sent before at a time (a soak's front end stepped at each), and then holds
whatever came first, however rare. `WordCache` holds it to `WORDS` words, a few
hundred KiB that the first requests fill, and empties it every `SECONDS` so
that it holds the words in use now. On source code the first thousand words
carry the hits: a warm 30k-token prompt of the repository's own code encodes
in 34 ms with 1,024 words as with 10,000, and in 39 ms (+13%) with none, or
with 1,024 taken by a prompt of random numbers.

It knows the tokenizer's backend (`tokenizers`): a tokenizer without one, or a
model without the cache (WordPiece, Unigram, a `tokenizers` before 0.21), is
left as it is. Nothing of prompts or requests.
"""

from __future__ import annotations

import time
from typing import Callable

WORDS = 1024  # ~400 KiB of words; the default 10,000 is ~4 MiB
SECONDS = 600.0  # emptied this often, so that it holds the words in use now


def bpe_model(tokenizer):
    """The `tokenizers` model behind `tokenizer` (an mlx-lm wrapper, a transformers fast
    tokenizer or a `tokenizers.Tokenizer`) when it has a word cache to size; else None."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(inner, "backend_tokenizer", inner)
    model = getattr(backend, "model", None)
    if hasattr(model, "_resize_cache") and hasattr(model, "_clear_cache"):
        return model
    return None


class WordCache:
    """The word cache of one tokenizer's BPE: `words` at most, emptied every `seconds`
    (`tick`, on the thread that encodes). `bounded`: whether the tokenizer has one."""

    def __init__(
        self,
        tokenizer,
        words: int = WORDS,
        seconds: float = SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.model = bpe_model(tokenizer)
        self.words, self.seconds, self.clock = words, seconds, clock
        self.emptied = 0  # times emptied by `tick`
        self._since = clock()
        if self.model is not None:
            self.model._resize_cache(words)

    @property
    def bounded(self) -> bool:
        return self.model is not None

    def tick(self) -> None:
        """Empty the cache when `seconds` have passed since it was last emptied."""
        now = self.clock()
        if self.model is None or now - self._since < self.seconds:
            return
        self._since = now
        self.model._clear_cache()
        self.emptied += 1
