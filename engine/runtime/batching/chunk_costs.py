"""What a prefill chunk costs, learned from the chunks that ran: a fixed cost and a cost per token.

A chunk's forward takes `fixed_ms + token_ms * tokens`: the fixed part (the
graph built layer by layer in Python, the evaluations, the hand-over between
threads) is paid once per chunk whatever its size; the per-token part is the
arithmetic. Every backend has both, in proportions no constant here could
know, so they are fitted from measured chunks (`observe`): least squares over
the recent ones, each older one weighing FORGET times less. Until the sizes
seen vary enough to tell the two apart (chunks of one size alone cannot), the
fixed part reads 0 and the per-token part the plain ratio (what the policy
did before it knew better). Once told apart, the fixed part stays as last
told while the sizes settle (the policy sizes chunks alike once it knows
it: forgetting it then made every ~30th chunk one sized as if there were
none). No chunk costs less than its fixed part, so the
fit's fixed part is never more than the fastest of the RECENT last chunks:
on a loaded machine a few slow chunks tilt the line, and the intercept they
make up would size every chunk (the policy sizes chunks on it).

`TokenRate` keeps a cohort's recent cost per token beyond the fixed part
(its context's), weighted by tokens: a ratio of decayed sums, not a mean of
ratios, so a one-token chunk slowed by a load spike weighs one token's worth
(a mean of ratios let it set the rate, which shrank the next chunks to one
token, whose noise set it again). It knows numbers only: no clock, no MLX.
"""

from __future__ import annotations

from collections import deque

FORGET = 0.95  # weight of an observation relative to the next newer one
SPREAD = 0.25  # the sizes' relative spread from which the fit is trusted
RECENT = 32  # the last chunks whose fastest bounds the fixed part
KEEP = 0.7  # TokenRate: weight of the sums so far against the newest chunk's
FLOOR = 0.1  # the share of a chunk's mean time that is per token, at least


class ChunkCosts:
    """Exponentially weighted least squares of ms over tokens (module doc)."""

    def __init__(self, forget: float = FORGET):
        self.forget = forget
        self.w = self.x = self.y = self.xx = self.xy = 0.0
        self.count = 0
        self.recent: deque = deque(maxlen=RECENT)  # the last chunks' ms
        self.told: float | None = None  # the fixed part, as last told apart (module doc)

    def observe(self, tokens: int, ms: float) -> None:
        """A chunk of `tokens` prompt tokens (all its sequences') took `ms`."""
        if tokens <= 0 or ms <= 0:
            return
        f = self.forget
        self.w = f * self.w + 1
        self.x = f * self.x + tokens
        self.y = f * self.y + ms
        self.xx = f * self.xx + tokens * tokens
        self.xy = f * self.xy + tokens * ms
        self.count += 1
        self.recent.append(ms)
        fit = self._separated()
        if fit is not None:
            self.told = fit[0]

    def _fit(self) -> tuple[float, float] | None:
        """(fixed_ms, token_ms) once the sizes seen have told them apart, else None."""
        fit = self._separated()
        if fit is not None or self.told is None:
            return fit
        # Sizes settled since (the policy's own, once it knows): the fixed part stays as
        # told, bounded by the fastest recent chunk, and the rest of the mean is per token.
        mean_x, mean_y = self.x / self.w, self.y / self.w
        fixed = min(self.told, min(self.recent))
        return fixed, max(mean_y - fixed, FLOOR * mean_y) / mean_x

    def _separated(self) -> tuple[float, float] | None:
        """(fixed_ms, token_ms) when the recent sizes tell them apart, else None."""
        if self.count < 3:
            return None
        mean_x, mean_y = self.x / self.w, self.y / self.w
        var_x = self.xx / self.w - mean_x * mean_x
        if var_x <= (SPREAD * mean_x) ** 2:
            return None
        slope = (self.xy / self.w - mean_x * mean_y) / var_x
        fixed = mean_y - slope * mean_x
        if slope <= 0:
            return None
        if fixed < 0:  # superlinear at these sizes (a longer context): all of it per token
            return 0.0, mean_y / mean_x
        if fixed > min(self.recent):  # tilted by slow chunks: the fastest one bounds it
            fixed = min(self.recent)
            return fixed, (mean_y - fixed) / mean_x
        return fixed, slope

    @property
    def fixed_ms(self) -> float:
        fit = self._fit()
        return 0.0 if fit is None else fit[0]

    @property
    def token_ms(self) -> float:
        """ms per token beyond the fixed cost (the plain ratio until the fit holds)."""
        fit = self._fit()
        if fit is not None:
            return fit[1]
        return self.y / self.x if self.x else 0.0


class TokenRate:
    """Recent ms per token beyond the fixed cost, weighted by tokens (module doc)."""

    def __init__(self, keep: float = KEEP):
        self.keep = keep
        self.ms = self.tokens = 0.0

    def observe(self, tokens: int, ms: float) -> None:
        """A chunk of `tokens` spent `ms` beyond its fixed cost."""
        if tokens > 0 and ms > 0:
            self.ms = self.keep * self.ms + ms
            self.tokens = self.keep * self.tokens + tokens

    @property
    def token_ms(self) -> float:
        """0 until a chunk is seen."""
        return self.ms / self.tokens if self.tokens else 0.0
