"""What the model actor streams back for one request: progress, tokens, the final event.

Plain frozen dataclasses (no MLX, no Ray): they cross the Ray boundary between
the model actor and the front end, which translates them to gRPC events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engine.cache.kinds import RestoreKind, TextEnum

# Where a request's events go, one at a time (the model actor's stream, a test's list).
Emit = Callable[[object], None]


class FinishReason(TextEnum):
    """Why a request's stream ended."""

    STOP = "stop"  # a stop token or stop string
    LENGTH = "length"  # max_tokens (or the context) reached
    CANCELLED = "cancelled"  # the client went away, or cancelled
    ERROR = "error"  # admission or the batch failed; Finished.error says why
    UNAVAILABLE = "unavailable"  # the engine restarted under it (the front end may retry)


@dataclass(frozen=True)
class Timing:
    """Where one request's time went, and what its restore and commit copied."""

    queue_ms: float = 0.0  # received to admitted, less the plan
    plan_ms: float = 0.0  # the cache manager's plan
    restore_ms: float = 0.0  # the restore at admission
    prefill_ms: float = 0.0  # admitted to the last prompt token fed
    commit_ms: float = 0.0  # stored to the manager's Orders applied
    ttft_ms: float = 0.0  # received to the first token
    decode_tps: float = 0.0  # tokens per second after the first
    bytes_copied_restore: int = 0  # the batch merge of its restored KV rows and state
    bytes_copied_commit: int = 0  # state snapshots stored, copying extractions
    restored_kv_bytes: int = 0
    # Its rows copied when the batches changed shape around it (others joined or left,
    # a prompt batch split) or outgrew their buffers (engine.runtime.batching.copies)
    bytes_copied_batch: int = 0
    # Speculative decoding: draft tokens verified for it, how many were accepted, and the
    # verify steps it drafted in
    drafted: int = 0
    accepted: int = 0
    draft_steps: int = 0


@dataclass(frozen=True)
class Progress:
    done: int  # prompt tokens in the cache, restored ones included
    total: int


@dataclass(frozen=True)
class TokenLogprobs:
    """One token's log-probability, and the most likely tokens at its position (id, logprob),
    most likely first; `token` / `top_tokens`: their text, once the front end decoded them."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    token: str = ""
    top_tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tokens:
    ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per id, when the request asked
    index: int = 0  # its branch (SamplingParams.n): 0 .. n-1


@dataclass(frozen=True)
class Finished:
    request_id: str
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    restore_kind: RestoreKind
    restore_length: int
    timing: Timing = field(default_factory=Timing)
    error: str = ""
    replica: str = ""  # the model replica that ran it (set by its actor)
    # "entry@length" of the planned restore point the model actor found gone
    # (it asked for a new plan; "" when the plan's restore was done as planned)
    restore_lost: str = ""
    # A constrained request that ended before its grammar was complete (max_tokens, a stop
    # string, cancelled): its output is not valid for its grammar
    incomplete: bool = False
    index: int = 0  # its branch: a request of n branches ends with n Finished events
    stop_sequence: str = ""  # the stop string that ended it (set by the front end)
