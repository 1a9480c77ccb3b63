"""A request's final event, from plain values.

`final_event` and `unstarted_event` build the Finished event from counts, the
request's timestamps (`Stamps`) and the bytes its restore, commit and batch
copied (`Copied`). The text of the tokens is not made here: the front end
detokenizes (engine.server.front.text), a whole step's tokens at once.

It knows numbers and the events' dataclasses; nothing of the batch, the
cache, MLX arrays or where events go.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.cache.kinds import RestoreKind
from engine.runtime.events import Finished, FinishReason, Timing


@dataclass
class Stamps:
    """One request's clock, `time.time()` values, from its arrival at the front end."""

    received: float
    plan_ms: float  # the cache manager's plan, inside received -> admitted
    admitted: float
    restore_ms: float
    prefill_end: float | None = None  # the last prompt token fed
    first: float | None = None  # the first completion token
    last: float | None = None  # the latest completion token

    def token(self, now: float) -> None:
        """A completion token came at `now`."""
        if self.first is None:
            self.first = now
        self.last = now


@dataclass(frozen=True)
class Copied:
    """The bytes one request's restore, commit and batch copied (Timing's counters)."""

    restore: int = 0  # the batch merge of its restored rows and state
    commit: int = 0  # state snapshots stored, copying extractions
    restored_kv: int = 0  # the KV rows it restored (read, not copied)
    batch: int = 0  # its rows copied when the batches changed shape around it


def final_event(
    request_id: str,
    reason: FinishReason,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    restore_kind: RestoreKind,
    restore_length: int,
    stamps: Stamps,
    copied: Copied,
    commit_ms: float = 0.0,
    error: str = "",
    restore_lost: str = "",
    drafts: tuple[int, int, int] = (0, 0, 0),
    incomplete: bool = False,
    index: int = 0,
) -> Finished:
    """The Finished event of a request that was admitted (restored, maybe prefilled)."""
    return Finished(
        request_id=request_id,
        finish_reason=reason,
        prompt_tokens=prompt_tokens,
        cached_tokens=restore_length,
        completion_tokens=completion_tokens,
        restore_kind=restore_kind,
        restore_length=restore_length,
        timing=_timing(stamps, completion_tokens, commit_ms, copied, drafts),
        error=error,
        restore_lost=restore_lost,
        incomplete=incomplete,
        index=index,
    )


def unstarted_event(
    request_id: str, prompt_tokens: int, reason: FinishReason, error: str = ""
) -> Finished:
    """The Finished event of a request that ended before admission: nothing restored or run."""
    return Finished(
        request_id=request_id,
        finish_reason=reason,
        prompt_tokens=prompt_tokens,
        cached_tokens=0,
        completion_tokens=0,
        restore_kind=RestoreKind.NONE,
        restore_length=0,
        error=error,
    )


def _timing(
    stamps: Stamps, completion_tokens: int, commit_ms: float, copied: Copied, drafts=(0, 0, 0)
) -> Timing:
    first, last, n = stamps.first, stamps.last, completion_tokens
    decode_tps = 0.0
    if first is not None and last is not None and last > first and n > 1:
        decode_tps = (n - 1) / (last - first)
    return Timing(
        queue_ms=max(0.0, (stamps.admitted - stamps.received) * 1000 - stamps.plan_ms),
        plan_ms=stamps.plan_ms,
        restore_ms=stamps.restore_ms,
        prefill_ms=((stamps.prefill_end or time.time()) - stamps.admitted) * 1000,
        commit_ms=commit_ms,
        ttft_ms=((first - stamps.received) * 1000) if first else 0.0,
        decode_tps=decode_tps,
        bytes_copied_restore=copied.restore,
        bytes_copied_commit=copied.commit,
        restored_kv_bytes=copied.restored_kv,
        bytes_copied_batch=copied.batch,
        drafted=drafts[0],
        accepted=drafts[1],
        draft_steps=drafts[2],
    )
