"""What a client is told of how much of its prompt was cached: exact, or the block alone.

Unless the operator asks for exact figures (`--exact-cache-figures`), every
figure a client gets that depends on the restore length n is computed from n
rounded down to a block (CACHE_BLOCK tokens), or not sent, so a caller that
shares a prompt's start learns nothing finer than the block:

- `cached_tokens` and the restore length: rounded down; the restore kind is
  `none` when less than a block was restored;
- `restored_kv_bytes` (KV bytes per token x n): scaled to the rounded length;
- `bytes_copied_restore` (the KV rows plus the recurrent state: not linear in
  n), `bytes_copied_commit` (its capture count tells whether L - n passed the
  guard threshold) and `bytes_copied_batch` (it follows other sequences'
  lengths): 0;
- the timing breakdown (queue, plan, restore, prefill, commit), which isolates
  the prefill from the rest: 0. Time to first token and decode speed stay:
  the client's own clock measures them anyway;
- prefill progress: `done` rounded down, and sent at most once a
  PROGRESS_EVERY_S from the request's start. Where prefill chunks end depends
  on n (chunk sizes, capture points), so progress at chunk ends told n; the
  clock does not.

The server's log and Inspect keep exact figures. It knows the runtime's events
and the block; nothing of gRPC.
"""

from __future__ import annotations

import dataclasses
import time

from engine.cache.kinds import RestoreKind
from engine.config import CACHE_BLOCK
from engine.runtime.events import Finished, Progress, Timing

PROGRESS_EVERY_S = 1.0


def block(n: int) -> int:
    """`n` rounded down to a block."""
    return n - n % CACHE_BLOCK


def rounded(f: Finished) -> Finished:
    """The final event with every figure that depends on the restore length from its block."""
    n, length = f.restore_length, block(f.restore_length)
    timing = Timing(
        ttft_ms=f.timing.ttft_ms,
        decode_tps=f.timing.decode_tps,
        restored_kv_bytes=f.timing.restored_kv_bytes * length // n if n else 0,
    )
    kind = f.restore_kind if length else RestoreKind.NONE
    return dataclasses.replace(
        f,
        restore_length=length,
        restore_kind=kind,
        cached_tokens=block(f.cached_tokens),
        timing=timing,
    )


class ClientFigures:
    """One request's events as its client sees them (exact, or rounded and paced)."""

    def __init__(self, exact: bool, now=time.monotonic):
        self.exact, self.now = exact, now
        self.progress_at = now()  # the request's start, then the last progress sent

    def shown(self, event):
        """The event to send, or None to send nothing for it."""
        if self.exact:
            return event
        if isinstance(event, Finished):
            return rounded(event)
        if isinstance(event, Progress):
            if self.now() - self.progress_at < PROGRESS_EVERY_S:
                return None
            self.progress_at = self.now()
            done = block(event.done) if event.done < event.total else event.done
            return dataclasses.replace(event, done=done)
        return event
