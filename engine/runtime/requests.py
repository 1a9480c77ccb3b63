"""What the model actor is asked to run: a planned prompt and how to sample it.

Plain frozen dataclasses (no MLX, no Ray): the front end builds them, Ray
carries them to the model actor, the Generator admits them.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.cache.messages import RestorePlan
from engine.runtime.structured.grammar import Grammar


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False  # each token's log-probability comes with it (Tokens.logprobs)
    top_logprobs: int = 0  # and the most likely tokens at its position (0-20)
    n: int = 1  # branches: n sequences forked from one prefill (engine.runtime.branches)


@dataclass(frozen=True)
class GenerationRequest:
    """A planned prompt for the model actor."""

    request_id: str
    namespace: str
    tokens: tuple[int, ...]
    plan: RestorePlan
    sampling: SamplingParams
    received_at: float  # time.time() when the front end got the call
    plan_ms: float = 0.0
    grammar: Grammar | None = None  # what the output is held to (engine.runtime.structured)
