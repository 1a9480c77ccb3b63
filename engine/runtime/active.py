"""One request in the batch: what the Generator keeps for it from admission to its end.

Its request and where its events go, its uid in the batch, the restore it
started from, the capture points its prefill is yet to reach and the state
snapshots taken at the ones it reached, the prompt end's state and
log-probabilities, the tokens it generated, timestamps (`Stamps`) and the
bytes it copied, from which its final event is made. A mutable record the
Generator fills in step by step; it decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.cache.kinds import RestoreKind
from engine.runtime.events import Emit, Finished, FinishReason
from engine.runtime.output import Copied, Stamps, final_event
from engine.runtime.requests import GenerationRequest

if TYPE_CHECKING:
    from engine.runtime.structured.matcher import Matcher


@dataclass
class ActiveRequest:
    """One request in the batch."""

    req: GenerationRequest
    emit: Emit
    uid: int
    restore_kind: RestoreKind
    restore_length: int
    captures: list  # pending CapturePoints, ascending
    stop_ids: frozenset
    stamps: Stamps
    restored_kv_bytes: int
    copied_restore: int = 0
    generated: int = 0  # completion tokens emitted (a stop token is not one)
    copied_commit: int = 0
    progress_sent: int = 0  # prompt tokens done at the last Progress event
    taken: dict = field(default_factory=dict)  # length -> (CapturePoint, StateSnapshot)
    anchor: tuple[int, int] | None = None  # (entry id, length) of the anchor it stored
    prompt_end_state: object = None
    prompt_end_logits: object = None  # what the first token was sampled from
    resent: bool = False  # restored at the prompt end: its first token came from stored logits
    restore_lost: str = ""  # "entry@length" of a planned restore found gone
    matcher: Matcher | None = None  # its grammar's matcher, when the request asks for one
    index: int = 0  # its branch of the request (SamplingParams.n)
    key: str = ""  # its key in the generator's books: the request id, "<id>#<index>" a branch's
    branches: int = 1  # branch 0: the request's n

    @property
    def prompt_len(self) -> int:
        return len(self.req.tokens)

    def final_event(
        self,
        reason: FinishReason,
        batch_copied: int,
        drafts: tuple[int, int, int],
        commit_ms: float = 0.0,
        error: str = "",
    ) -> Finished:
        """Its Finished event; `batch_copied`: its rows' bytes the batch copied, `drafts`:
        its drafted, accepted and verify steps (engine.runtime.output)."""
        copied = Copied(
            restore=self.copied_restore,
            commit=self.copied_commit,
            restored_kv=self.restored_kv_bytes,
            batch=batch_copied,
        )
        return final_event(
            self.req.request_id,
            reason,
            prompt_tokens=self.prompt_len,
            completion_tokens=self.generated,
            restore_kind=self.restore_kind,
            restore_length=self.restore_length,
            stamps=self.stamps,
            copied=copied,
            commit_ms=commit_ms,
            error=error,
            restore_lost=self.restore_lost,
            drafts=drafts,
            incomplete=self.matcher is not None and not self.matcher.accepting(),
            index=self.index,
        )
