"""One sequence's grammar matcher, and the compiled grammars of a model, cached.

`Matcher` is the interface the loop (and speculative decoding) uses, one
per constrained sequence: `mask()` is the bitmask of the tokens allowed next
(numpy int32 words, bit t of word t // 32; None when nothing is held),
`accept(token)` advances, `rollback(n)` takes back the last n tokens,
`validate(tokens)` says how many leading draft tokens the grammar allows,
`stopped()` (nothing but the end may follow) and `accepting()` (the output
is complete here). Matching starts at the first generated token: a restored
prefix or a prompt needs no matcher state.

The end of the output is the engine's, not llguidance's: where the grammar is
complete the mask also allows the request's stop tokens (the chat template's
end, `<|im_end|>`), and accepting one ends the matcher (`done`); where nothing
but the end may follow, only those tokens are allowed.

`Grammars` compiles a Grammar against the model's tokenizer once and keeps
the pristine matcher by the grammar's key (bounded, least recently used
dropped: `--grammar-cache`, which the memory shares count); each sequence gets
a deep copy (a few µs). Its counters: compiled, hits, compile time.

llguidance and numpy only: no MLX (the mask is applied where the row is
sampled, engine.runtime.structured.masked_batch).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np

from engine.runtime.structured.grammar import Grammar

log = logging.getLogger(__name__)


def words_of(vocab_size: int) -> int:
    """int32 words of one row's bitmask."""
    return (vocab_size + 31) // 32


class Matcher:
    """One sequence's matcher (module doc)."""

    def __init__(self, matcher, stop_ids: frozenset, vocab_size: int, kind: str = ""):
        self.matcher = matcher
        self.kind = kind
        self.stop_ids = tuple(sorted(t for t in stop_ids if 0 <= t < vocab_size))
        self.words = words_of(vocab_size)
        self.done = False  # a stop token was accepted where the grammar was complete
        self.failed = ""  # a token the grammar refused (never, once masked): why
        self.consumed = 0

    def mask(self) -> np.ndarray | None:
        """The allowed next tokens (int32 words), or None once done."""
        if self.done:
            return None
        bits = np.zeros(self.words, dtype=np.int32)
        if self.failed or self.matcher.is_stopped():
            return self._with_stops(bits)
        self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        return self._with_stops(bits) if self.matcher.is_accepting() else bits

    def _with_stops(self, bits: np.ndarray) -> np.ndarray:
        view = bits.view(np.uint32)
        for t in self.stop_ids:
            view[t // 32] |= np.uint32(1 << (t % 32))
        return bits

    def accept(self, token: int) -> bool:
        """Advance by `token`; False (and `failed` says why) when the grammar refuses it."""
        if self.done or self.failed:
            return False
        if token in self.stop_ids and (self.matcher.is_accepting() or self.matcher.is_stopped()):
            self.done = True
            return True
        if self.matcher.is_stopped() or not self.matcher.consume_token(int(token)):
            self.failed = f"token {token} refused: {self.matcher.get_error() or 'grammar ended'}"
            log.warning("the %s grammar: %s", self.kind, self.failed)
            return False
        self.consumed += 1
        return True

    def rollback(self, n: int) -> None:
        """Take back the last `n` accepted tokens (a stop token accepted counts as one)."""
        if n <= 0:
            return
        if self.done:
            self.done, n = False, n - 1
        if n:
            self.matcher.rollback(n)
            self.consumed -= n

    def validate(self, tokens) -> int:
        """How many leading `tokens` the grammar allows from here (a draft's checked part)."""
        if self.done or self.failed:
            return 0
        return int(self.matcher.validate_tokens([int(t) for t in tokens]))

    def stopped(self) -> bool:
        """Nothing but the end may follow (or the end was accepted)."""
        return self.done or bool(self.failed) or self.matcher.is_stopped()

    def accepting(self) -> bool:
        """The output so far is complete for the grammar."""
        return self.done or (not self.failed and self.matcher.is_accepting())


def llguidance_tokenizer(tokenizer, vocab_size: int):
    """llguidance's view of an HF fast tokenizer, or of mlx-lm's wrapper of one."""
    import llguidance.hf

    inner = getattr(tokenizer, "_tokenizer", None)
    hf = inner if hasattr(inner, "backend_tokenizer") else tokenizer
    return llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size)


class Grammars:
    """The compiled grammars of one model (module doc)."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids, capacity: int = 64):
        self.hf = tokenizer  # an HF fast tokenizer, or mlx-lm's wrapper of one
        self.vocab_size = vocab_size
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.capacity = capacity
        self.pristine: OrderedDict[str, object] = OrderedDict()
        self._tokenizer = None
        self.compiled = 0  # grammars compiled (cache misses)
        self.hits = 0

    @property
    def tokenizer(self):
        """llguidance's view of the tokenizer, built at the first constrained request."""
        if self._tokenizer is None:
            self._tokenizer = llguidance_tokenizer(self.hf, self.vocab_size)
        return self._tokenizer

    def matcher(self, grammar: Grammar, stop_ids=()) -> Matcher:
        """A fresh matcher for `grammar` at its start. Raises ValueError when it does not
        compile (the front end checked it: a grammar refused here is a bug)."""
        from llguidance import LLMatcher

        key = grammar.key
        pristine = self.pristine.get(key)
        if pristine is None:
            pristine = LLMatcher(self.tokenizer, LLMatcher.grammar_from_lark(grammar.lark))
            if pristine.is_error():
                raise ValueError(f"the grammar does not compile: {pristine.get_error()}")
            self.compiled += 1
            self.pristine[key] = pristine
            while len(self.pristine) > self.capacity:
                self.pristine.popitem(last=False)
        else:
            self.hits += 1
            self.pristine.move_to_end(key)
        stops = self.stop_ids | frozenset(stop_ids)
        return Matcher(pristine.deep_copy(), stops, self.vocab_size, grammar.kind)

    def for_request(self, grammar: Grammar | None, stop_ids=()) -> Matcher | None:
        """A fresh matcher for a request's grammar, None without one; an optional grammar
        (the engine's own) that does not compile leaves the request unconstrained (the
        front end checked it: this is the backstop)."""
        if grammar is None:
            return None
        try:
            return self.matcher(grammar, stop_ids)
        except ValueError as e:
            if not grammar.optional:
                raise
            log.warning("the %s grammar does not compile; unconstrained: %s", grammar.kind, e)
            return None
