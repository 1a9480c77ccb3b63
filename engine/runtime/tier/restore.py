"""Restore at admission: a plan's restore point into fresh layer caches, or sent back if gone.

`Restorer.restore` reads the plan's restore point from the RAM tier (its file
loaded first when the plan says so) into single-sequence layer caches,
without copying the KV rows. A point the tier no longer holds, nor can load,
goes back to the cache manager as a LostRestore (`CacheLink.replan`); the
request waits in `replanning` for its new plan and then goes back to the head
of the pending requests. So does a point whose entry holds other tokens than
the request's first `length` (`RamTier.matches`: an id that came to mean
another prompt is a cache miss, never its rows). Found gone again, it prefills cold. Both are logged
and counted, and the request's final event names the lost point
(`take_lost_point`).

It knows the RAM tier and the order ledger; it knows nothing of the batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable

from engine.cache.kinds import RestoreKind
from engine.cache.messages import LostRestore, Release, Replanned
from engine.runtime import layer_caches
from engine.runtime.events import Emit
from engine.runtime.ordering import OrderLedger
from engine.runtime.requests import GenerationRequest
from engine.runtime.tier.ram import RamTier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    kind: RestoreKind
    length: int  # tokens restored (0: a cold prefill)
    cache: list | None  # the layer caches at `length`; None when cold
    restored_kv: int  # bytes of the KV rows it reads
    copied: int  # bytes the restore copied


COLD = Restored(RestoreKind.NONE, 0, None, 0, 0)


class Restorer:
    """A plan's restore point into layer caches; the requests whose point was found gone."""

    def __init__(
        self,
        tier: RamTier,
        ledger: OrderLedger,
        readmit: Callable[[GenerationRequest, Emit], None],
    ):
        """`readmit` puts a request with its new plan back at the head of the pending ones."""
        self.tier = tier
        self.ledger = ledger
        self.readmit = readmit
        self.replanning: dict[str, tuple[GenerationRequest, Emit]] = {}
        self.lost: dict[str, str] = {}  # request id -> the restore point found gone

    def restore(self, req: GenerationRequest, emit: Emit) -> Restored | None:
        """The plan's restore point, or None: it is gone, and the request waits for a new plan."""
        plan = req.plan
        kind, n = plan.kind, plan.length
        loaded = self.tier.prepare(plan, req.namespace, req.tokens)  # a disk entry into RAM
        whole = n == len(req.tokens)  # a resend restores the prompt end and its logits
        gone = not self.tier.can_restore(plan.entry_id, n) or (
            whole and self.tier.logits(plan.entry_id, n) is None
        )
        # The safety net: rows computed on other tokens are never restored (a miss instead).
        gone = gone or (n > 0 and not self.tier.matches(plan.entry_id, req.tokens[:n]))
        if n and gone:
            first = req.request_id not in self.lost
            self.lost[req.request_id] = f"{plan.entry_id}@{n}"
            log.warning(
                "request %s: restore point %s@%d is gone; %s",
                req.request_id,
                plan.entry_id,
                n,
                "asking for a new plan" if first else "prefilling cold",
            )
            if first:
                self.replanning[req.request_id] = (req, emit)
                lost = LostRestore(req.request_id, plan.entry_id, n, load_failed=not loaded)
                self.ledger.replan(lost, self._on_replanned)
                return None
            return COLD
        if not n:
            return replace(COLD, kind=kind)
        counter = layer_caches.CopyCounter()
        cache = self.tier.restore(plan.entry_id, n, counter)
        restored_kv = layer_caches.kv_bytes_per_token(self.tier.entries[plan.entry_id].layers) * n
        return Restored(kind, n, cache, restored_kv, counter.copied_kv)

    def _on_replanned(self, replanned: Replanned) -> None:
        """A lost restore's new plan: the request goes back to the head of the pending ones."""
        self.tier.apply(replanned.orders)
        if replanned.plan is None:  # the manager no longer plans it (a failed call)
            return
        waiting = self.replanning.pop(replanned.plan.request_id, None)
        if waiting is None:  # cancelled meanwhile: the new plan's ids go back
            self.ledger.release(Release(request_id=replanned.plan.request_id), self.tier.apply)
            return
        req, emit = waiting
        self.readmit(replace(req, plan=replanned.plan), emit)

    def withdraw(self, request_id: str) -> tuple[GenerationRequest, Emit] | None:
        """Take out a request waiting for its new plan (cancelled); None if it is not."""
        return self.replanning.pop(request_id, None)

    def take_lost_point(self, request_id: str) -> str:
        """Take (and forget) "entry@length", the request's restore point found gone ("" if none)."""
        return self.lost.pop(request_id, "")

    def clear(self) -> None:
        """Forget every request waiting for a new plan (the manager that planned it is gone)."""
        self.replanning, self.lost = {}, {}
