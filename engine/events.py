"""What the model actor streams back for one request, and what it is asked to run.

Plain frozen dataclasses (no MLX, no Ray): they cross the Ray boundary between
the model actor and the front end, which translates them to gRPC events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.messages import RestorePlan


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


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


@dataclass(frozen=True)
class Progress:
    done: int  # prompt tokens in the cache, restored ones included
    total: int


@dataclass(frozen=True)
class Tokens:
    ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class Finished:
    request_id: str
    finish_reason: str  # stop | length | cancelled | error
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    restore_kind: str
    restore_length: int
    timing: dict[str, float] = field(default_factory=dict)
    error: str = ""
