"""How many drafts one sequence asks for next: fixed, or adapted to its recent acceptance.

With a fixed K (`--num-draft-tokens K`) every verify asks for K. With `auto`
each sequence keeps an average of the drafts it accepted per verify: K
follows it (one more than what it has been accepting, between 1 and
`AUTO_MAX`), and a sequence whose drafts don't pay (on average fewer than
`PAYS` accepted per verify, once it has been tried `TRIES` times) stops
drafting for a while: it decodes plainly for `cooldown` tokens, a span that
doubles each time it fails again, up to `MAX_COOLDOWN`, and is halved back
when drafts pay again. Free text then costs a verify now and then and
nothing else.

Plain Python; it knows counts, not tokens or tensors.
"""

from __future__ import annotations

AUTO_START = 4
AUTO_MAX = 8
PAYS = 0.6  # accepted drafts per verify below which a verify costs more than it gives
TRIES = 4  # verifies before the average is trusted
WEIGHT = 0.3  # of the newest verify in the average
MIN_COOLDOWN, MAX_COOLDOWN = 16, 512


class DraftLength:
    """The draft count of one sequence (`fixed` K, or None for auto)."""

    def __init__(self, fixed: int | None):
        self.fixed = fixed
        self.mean = float(AUTO_START)  # accepted drafts per verify, recent average
        self.tries = 0
        self.cooldown = MIN_COOLDOWN
        self.resting = 0  # tokens left to decode plainly

    def wanted(self) -> int:
        """Drafts to ask for at this step (0: decode plainly)."""
        if self.fixed is not None:
            return self.fixed
        if self.resting > 0:
            return 0
        return max(1, min(AUTO_MAX, round(self.mean) + 1))

    def verified(self, asked: int, accepted: int) -> None:
        """A verify of `asked` drafts accepted `accepted` of them."""
        if self.fixed is not None or asked == 0:
            return
        self.tries += 1
        self.mean = (1 - WEIGHT) * self.mean + WEIGHT * accepted
        if self.tries >= TRIES and self.mean < PAYS:
            self.resting = self.cooldown
            self.cooldown = min(MAX_COOLDOWN, self.cooldown * 2)
            self.tries, self.mean = 0, float(AUTO_START)
        elif self.tries >= TRIES:
            self.cooldown = max(MIN_COOLDOWN, self.cooldown // 2)

    def decoded(self, tokens: int) -> None:
        """`tokens` were emitted (resting counts down)."""
        self.resting = max(0, self.resting - tokens)
