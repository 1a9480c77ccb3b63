"""A draft model as a draft source: a smaller model of the same tokenizer guesses ahead.

`DraftModel` drafts greedily with an mlx-lm model loaded from `--draft-model
PATH` (engine.runtime.model.draft_files loads it, and refuses it at startup when its
tokenizer's vocabulary is not the served model's, or the path is not a model). Per
sequence it keeps its own layer caches and the tokens they hold (`DraftRow`):

- Sync: each `propose(uid, context, k)` compares the tokens it fed with
  `context` (the sequence's whole context). Its drafts that the target
  rejected are not in `context`: the row is rewound to the mark taken just
  before it fed its drafts (engine.runtime.speculative.rollback's `hold`/`put_back`: KV
  trimmed, recurrent and conv state set back to the arrays held at the mark,
  sliding windows to their held slices), then fed what `context` has beyond
  the mark, accepted drafts included, in one forward. So its caches always
  equal a fresh prefill of the surviving context, for every architecture.
- First call: the whole context is prefilled in chunks of `prefill_step`
  tokens (a long agent prompt costs the draft its own prefill once; it pays
  only when the draft is much smaller than the served model).
- Draft: k greedy steps, one token each, built lazily and evaluated once (no
  host round trip per draft token). The last draft is not fed: it is kept
  (`guess`) for a call whose context is exactly what was fed, as the first
  draft is (`first`) for one whose context ends at the mark.

Rows draft one after another (one draft forward per row and draft token), not
batched across rows. Sampling at temperature > 0 verifies greedy drafts as
deterministic proposals (engine.runtime.speculative.verification), which keeps the
target's distribution.

`LookupOrDraft` is `--speculative auto`'s combination when a draft model is
configured: prompt lookup's guess where it matches a long n-gram (free, and
right on re-emitted text), else the draft model's. `auto` takes the draft
model only where it can pay (`draft_pays`): k drafts cost k draft forwards
beside the verify, so a draft whose decode step costs more than
`PAYING_COST` of the served model's gains nothing at the acceptance rates
text allows (expected tokens per step (1 - a^(k+1)) / (1 - a) against a cost
of 1 + k * c target steps: a = 0.75, k = 3 breaks even at c = 0.58).

It knows mlx-lm models and caches; nothing of the batch, the target or acceptance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from engine.runtime.speculative import rollback
from engine.runtime.speculative.drafts import MAX_NGRAM, DraftSource, PromptLookup

PREFILL_STEP = 512  # tokens per chunk of a row's first prefill
# auto's lookup: n-grams at least this long are trusted before the draft model.
LONG_MATCH = 3
# auto's draft model: its decode step at most this fraction of the served model's.
PAYING_COST = 0.4


@dataclass
class DraftRow:
    """One sequence's draft caches and the tokens they hold."""

    caches: list
    fed: list[int] = field(default_factory=list)
    mark: int = 0  # len(fed) when `held` was taken: before the drafts were fed
    held: list | None = None  # rollback.hold per cache at `mark`
    first: int | None = None  # the draft's token after `mark` (its first draft there)
    guess: int | None = None  # the draft's next token after `fed`, when known


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftModel:
    """Greedy drafts from a same-tokenizer model, its caches kept per sequence."""

    def __init__(self, model, prefill_step: int = PREFILL_STEP):
        self.model = model
        self.prefill_step = prefill_step
        self.rows: dict[int, DraftRow] = {}
        self.rewinds = 0  # rows rewound to their mark after a rejected draft
        self.restarts = 0  # rows prefilled again from nothing (a context that diverged)

    def propose(self, uid: int, context: Sequence[int], k: int) -> list[int]:
        if k <= 0 or not context:
            return []
        row = self._synced(uid, context)
        todo = list(context[len(row.fed) :])
        if todo:
            y = self._feed(row, todo)
        elif row.guess is not None:
            y = mx.array([row.guess])
        else:  # nothing to feed and no prediction kept: start the row again
            row = self.rows[uid] = DraftRow(make_prompt_cache(self.model))
            self.restarts += 1
            y = self._feed(row, list(context))
        # The mark: the caches hold `context` exactly; drafts fed from here on may be undone.
        row.mark, row.held = len(row.fed), [rollback.hold(c) for c in row.caches]
        drafts = [y]
        for _ in range(k - 1):
            y = self._step(row, y)
            drafts.append(y)
        mx.eval(drafts, [c.state for c in row.caches])
        tokens = [int(t.item()) for t in drafts]
        row.fed.extend(tokens[:-1])
        row.first, row.guess = tokens[0], tokens[-1]
        return tokens

    def forget(self, uid: int) -> None:
        self.rows.pop(uid, None)

    # ---- the row's caches ----------------------------------------------------

    def _synced(self, uid: int, context: Sequence[int]) -> DraftRow:
        """The row, its caches holding a prefix of `context` (rewound if needed)."""
        row = self.rows.get(uid)
        if row is None:
            row = self.rows[uid] = DraftRow(make_prompt_cache(self.model))
            return row
        common = _common(row.fed, context)
        if common == len(row.fed):
            return row
        if row.held is None or common < row.mark:  # diverged before the mark: start again
            row = self.rows[uid] = DraftRow(make_prompt_cache(self.model))
            self.restarts += 1
            return row
        # Some drafts were rejected: back to the mark; the accepted ones are fed again.
        undone = len(row.fed) - row.mark
        for cache, held in zip(row.caches, row.held):
            rollback.put_back(cache, held, undone)
        del row.fed[row.mark :]
        # What it predicted at the mark stands: a context ending there drafts from it.
        row.held, row.guess = None, row.first
        self.rewinds += 1
        return row

    def _feed(self, row: DraftRow, tokens: list[int]) -> mx.array:
        """Feed `tokens` (in prefill chunks); the greedy next token, lazy, shape [1]."""
        step = self.prefill_step
        for start in range(0, len(tokens) - step, step):
            self.model(mx.array([tokens[start : start + step]]), cache=row.caches)
            mx.eval([c.state for c in row.caches])
        last = len(tokens) - (len(tokens) - 1) % step - 1  # the last chunk's start
        logits = self.model(mx.array([tokens[last:]]), cache=row.caches)
        row.fed.extend(tokens)
        row.guess = None
        return mx.argmax(logits[:, -1, :], axis=-1)

    def _step(self, row: DraftRow, y: mx.array) -> mx.array:
        logits = self.model(y[None], cache=row.caches)
        return mx.argmax(logits[:, -1, :], axis=-1)


class LookupOrDraft:
    """Prompt lookup where it matches a long n-gram, else the draft model (auto's pair).

    Lookup's long matches cost nothing and are what re-emitted text is made of;
    its short matches on free text are guesses the draft model makes better.
    The draft model catches up on what lookup drafted at its next call (one
    forward)."""

    def __init__(self, draft: DraftSource, lookup: PromptLookup | None = None):
        self.lookup = lookup or PromptLookup(min_n=LONG_MATCH, max_n=MAX_NGRAM)
        self.draft = draft

    def propose(self, uid: int, context: Sequence[int], k: int) -> list[int]:
        return self.lookup.propose(uid, context, k) or self.draft.propose(uid, context, k)

    def forget(self, uid: int) -> None:
        self.lookup.forget(uid)
        self.draft.forget(uid)


def step_ms(model, context: int = 16, repeats: int = 5) -> float:
    """One decode step's ms: the best of `repeats` one-token forwards after a short prefill."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.zeros((1, context), dtype=mx.int32), cache=cache))
    best = float("inf")
    for _ in range(repeats):
        tic = time.perf_counter()
        mx.eval(model(mx.zeros((1, 1), dtype=mx.int32), cache=cache))
        best = min(best, time.perf_counter() - tic)
    return best * 1000


_COSTS: dict[tuple[int, int], float] = {}  # (id(draft), id(target)) -> measured cost


def draft_pays(draft, target) -> tuple[bool, float]:
    """(whether auto should use `draft` for `target`, its step cost as a fraction of the
    target's), measured once per pair of loaded models."""
    key = (id(draft), id(target))
    if key not in _COSTS:
        _COSTS[key] = step_ms(draft) / max(step_ms(target), 1e-6)
    return _COSTS[key] <= PAYING_COST, _COSTS[key]
