"""How many drafts each sequence asks for next: fixed, or chosen for speed under `auto`.

With a fixed K (`--num-draft-tokens K`) every verify asks for K. With `auto`:

- each sequence estimates its acceptance rate α, the chance that a draft is
  accepted given the one before it was (each verify is `accepted` successes
  and, if it stopped early, one failure; both decay, so α follows the text);
- a verify forward's cost is learned as a line in the tokens it feeds
  (`StepCosts`: ms = fixed + per_token * tokens, fitted on the recent
  steps, plain decode steps included): on a small model the fixed part
  dominates and drafts are nearly free, on a busy CPU with a full batch each
  token counts;
- the batch's K is the one that maximizes expected tokens per millisecond
  (`batch_k`): a row with rate α emits (1 - α^(K+1)) / (1 - α) tokens for a
  verify of K drafts, every other row one; a step where some row rejects
  also pays the rollback's replay (about a plain step);
- a sequence whose drafts don't pay (α below `PAYS` once it has been tried
  `TRIES` times) stops drafting for a while: it decodes plainly for
  `cooldown` tokens, a span that doubles each time it fails again, up to
  `MAX_COOLDOWN`, and halves when drafts pay again. Free text then costs a
  verify now and then and nothing else.

Plain Python; it knows counts and milliseconds, not tokens or tensors.
"""

from __future__ import annotations

from collections import deque

AUTO_MAX = 8
PRIOR = (3.0, 1.0)  # successes, failures: an unseen sequence starts at α = 0.75
PAYS = 0.35  # acceptance rate below which a sequence stops drafting for a while
TRIES = 4  # verifies before its rate is trusted
DECAY = 0.85  # weight of the past in the rate, per verify
MIN_COOLDOWN, MAX_COOLDOWN = 16, 512
COST_SAMPLES = 64


class DraftLength:
    """One sequence's acceptance rate and draft count (`fixed` K, or None for auto)."""

    def __init__(self, fixed: int | None):
        self.fixed = fixed
        self.successes, self.failures = PRIOR
        self.tries = 0
        self.cooldown = MIN_COOLDOWN
        self.resting = 0  # tokens left to decode plainly

    @property
    def rate(self) -> float:
        """α: the chance that a draft is accepted, given the previous one was."""
        return self.successes / (self.successes + self.failures)

    def wanted(self) -> int:
        """Drafts to ask for at this step (0: decode plainly); `batch_k` may lower it."""
        if self.fixed is not None:
            return self.fixed
        return 0 if self.resting > 0 else AUTO_MAX

    def verified(self, asked: int, accepted: int) -> None:
        """A verify of `asked` drafts accepted `accepted` of them."""
        if self.fixed is not None or asked == 0:
            return
        self.tries += 1
        self.successes = DECAY * self.successes + accepted
        self.failures = DECAY * self.failures + (1 if accepted < asked else 0)
        if self.tries >= TRIES and self.rate < PAYS:
            self.resting = self.cooldown
            self.cooldown = min(MAX_COOLDOWN, self.cooldown * 2)
            self.tries = 0
            self.successes, self.failures = PRIOR
        elif self.tries >= TRIES:
            self.cooldown = max(MIN_COOLDOWN, self.cooldown // 2)

    def decoded(self, tokens: int) -> None:
        """`tokens` were emitted (resting counts down)."""
        self.resting = max(0, self.resting - tokens)


class StepCosts:
    """A forward's milliseconds as a line in the tokens it feeds, fitted on recent steps."""

    def __init__(self):
        self.samples: deque = deque(maxlen=COST_SAMPLES)

    def record(self, tokens: int, ms: float) -> None:
        self.samples.append((tokens, ms))

    def line(self) -> tuple[float, float] | None:
        """(fixed ms, ms per token), or None until steps of two sizes were seen."""
        if len({n for n, _ in self.samples}) < 2:
            return None
        n = [float(a) for a, _ in self.samples]
        ms = [float(b) for _, b in self.samples]
        mean_n, mean_ms = sum(n) / len(n), sum(ms) / len(ms)
        var = sum((x - mean_n) ** 2 for x in n)
        slope = sum((x - mean_n) * (y - mean_ms) for x, y in zip(n, ms)) / var
        slope = max(0.0, slope)
        return max(0.0, mean_ms - slope * mean_n), slope


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a verify of k drafts emits at acceptance rate `rate` (the current one included)."""
    if rate >= 1.0:
        return float(k + 1)
    return (1 - rate ** (k + 1)) / (1 - rate)


def batch_k(
    rates: list[float | None], costs: StepCosts, replays: bool = True, most: int = AUTO_MAX
) -> int:
    """The draft count that maximizes the batch's expected tokens per ms.

    `rates[r]` is row r's acceptance rate, None for a row that does not draft;
    `replays`: a rejection costs a replay (the model has state layers). 0
    means a plain step pays best. Before the cost line is known: `most`."""
    line = costs.line()
    drafting = [a for a in rates if a is not None]
    if not drafting:
        return 0
    if line is None:
        return most
    fixed, per_token = line
    rows = len(rates)
    plain = fixed + per_token * rows
    best_k, best = 0, rows / max(plain, 1e-9)
    for k in range(1, most + 1):
        tokens = sum(1.0 if a is None else expected_tokens(a, k) for a in rates)
        all_accepted = 1.0
        for a in drafting:
            all_accepted *= a**k
        ms = fixed + per_token * rows * (k + 1) + (1 - all_accepted) * plain * replays
        if tokens / ms > best:
            best_k, best = k, tokens / ms
    return best_k
