"""Admission: which pending requests start now, and why the others wait.

Each step the Generator takes from `admissible()` the requests that may
start, in arrival order; every other pending request keeps its place and the
reason it waits (a `Wait`, in `waits`), so a log line or a test can say why.
The reasons, checked in this order:

- ORDERS_BEHIND: Orders handed out before its plan may still be on their way
  (`OrderLedger.behind`): a free decided before the plan must not land after
  its restore.
- ENTRY_STAGED: its restore source is an entry staged here, waiting aside for
  its commit's Orders (`RamTier.stage`).
- ANCHOR_CAPTURE: its plan waits on an anchor a request here is yet to
  capture; it restores there as soon as the anchor is stored.
- ROOM_ASKED: it loads a file, and the Orders that make room for the file's
  entry (the frees of what the manager evicted for it) are asked for
  (`CacheLink.room`, once, from here) and not applied yet.
- FILE_LOADING: its file is being read on the reader thread (`RamTier.start_load`,
  begun at the first look, so the read overlaps the waits above); the
  reader's callback rouses the loop when it ends.
- BATCH_FULL: its prompt plus max_tokens do not fit beside the running
  sequences within `max_batch_tokens`, or a request before it did not: the
  later ones wait behind it, so none overtakes.

It knows plans, the RAM tier's staged entries and reads, the order ledger and
the running requests' capture points and token counts. It restores nothing and
touches no tensor (no MLX: it sees the tier through the few methods of `TierView`,
and imports nothing of the tier package, which imports nothing of it).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Callable, Iterator, Protocol

from engine.cache.kinds import CaptureKind, TextEnum
from engine.cache.messages import Orders, RestorePlan
from engine.runtime.events import Emit
from engine.runtime.ordering import OrderLedger
from engine.runtime.requests import GenerationRequest

log = logging.getLogger(__name__)


class Wait(TextEnum):
    """Why a pending request does not start at this step (see the module doc)."""

    ORDERS_BEHIND = "orders behind"
    ENTRY_STAGED = "entry staged"
    ANCHOR_CAPTURE = "anchor in capture"
    ROOM_ASKED = "room asked"
    FILE_LOADING = "file loading"
    BATCH_FULL = "batch full"


class TierView(Protocol):
    """What admission asks of the RAM tier (`engine.runtime.tier.ram.RamTier` answers)."""

    disk_tier: object | None  # None: no disk behind the RAM tier
    staged_tokens: int  # the tokens of the entries staged aside for their Orders

    def staged(self, entry_id: int | None) -> bool: ...
    def can_restore(self, entry_id: int | None, length: int) -> bool: ...
    def start_load(self, plan: RestorePlan, wake: Callable[[], None]) -> Future | None: ...
    def forget_load(self, plan: RestorePlan) -> None: ...
    def apply(self, orders: Orders) -> None: ...


class Running(Protocol):
    """What admission reads of a request in the batch."""

    req: GenerationRequest
    uid: int
    restore_length: int
    captures: list  # the capture points its prefill is yet to reach, ascending


class Admission:
    """The pending requests, in order, and the rule that lets each into the batch."""

    def __init__(
        self,
        tier: TierView,
        ledger: OrderLedger,
        active: dict[int, Running],
        max_batch_tokens: int | None,
        wake: Callable[[], None],
    ):
        """`active`: the batch's requests by uid, the Generator's own dict, read live (each
        admission adds one). `wake` rouses the loop when a file read ends."""
        self.tier = tier
        self.ledger = ledger
        self.active = active
        # Prompt plus max_tokens of the running sequences together; None: no bound.
        self.max_batch_tokens = max_batch_tokens
        self.pending: list[tuple[GenerationRequest, Emit]] = []
        self.waits: dict[str, Wait] = {}  # request id -> why it waited at the last pass
        # Plans that load a file, by (request id, new entry id): the `seq` of the Orders
        # that made room for its entry, or None while that answer is on its way.
        self._rooms: dict[tuple[str, int | None], int | None] = {}
        self._wake = wake

    # ---- the queue ----------------------------------------------------------------

    def submit(self, req: GenerationRequest, emit: Emit) -> None:
        self.pending.append((req, emit))

    def put_first(self, req: GenerationRequest, emit: Emit) -> None:
        """A request back from the manager with a new plan: it goes ahead of the others."""
        self.pending.insert(0, (req, emit))

    def withdraw(self, request_id: str) -> tuple[GenerationRequest, Emit] | None:
        """Take a pending request out (cancelled); None if it is not pending."""
        for i, (req, emit) in enumerate(self.pending):
            if req.request_id == request_id:
                del self.pending[i]
                self.tier.forget_load(req.plan)  # its file's read, unless another waits too
                self._rooms.pop(_room_key(req), None)
                self.waits.pop(request_id, None)
                return req, emit
        return None

    def clear(self) -> None:
        """Forget every pending request and room (the manager that planned them is gone)."""
        self.pending, self.waits, self._rooms = [], {}, {}

    # ---- the pass -------------------------------------------------------------------

    def admissible(self) -> Iterator[tuple[GenerationRequest, Emit]]:
        """The pending requests that may start now, in order; each is judged after the one
        before it was admitted (it takes room in the batch). The others stay pending, with
        their reason in `waits`."""
        waiting: list[tuple[GenerationRequest, Emit]] = []
        before, self.waits = self.waits, {}
        full = False  # once one request does not fit, later ones wait behind it
        try:
            while self.pending:  # a request replanned meanwhile comes back at the head
                req, emit = self.pending.pop(0)
                why = self._why(req, full)
                if why is None:
                    self._rooms.pop(_room_key(req), None)
                    yield req, emit
                    continue
                full = full or why is Wait.BATCH_FULL
                self.waits[req.request_id] = why
                if before.get(req.request_id) is not why:
                    log.debug("request %s waits: %s", req.request_id, why)
                waiting.append((req, emit))
        finally:
            self.pending[:0] = waiting

    def _why(self, req: GenerationRequest, full: bool) -> Wait | None:
        """Why `req` waits now, or None when it may start."""
        loading = self._loading(req)  # started first: the read overlaps the waits below
        if self.ledger.behind(req.plan.after_orders):
            return Wait.ORDERS_BEHIND
        if self.tier.staged(req.plan.entry_id):
            return Wait.ENTRY_STAGED
        if self._anchor_in_capture(req):
            return Wait.ANCHOR_CAPTURE
        if self._awaits_room(req):
            return Wait.ROOM_ASKED
        if loading:
            return Wait.FILE_LOADING
        if full or not self._fits(req):
            return Wait.BATCH_FULL
        return None

    @property
    def has_work(self) -> bool:
        """A pending request that is not only waiting for its file (the reader's callback
        rouses the loop then) or for its room's Orders (so does their answer)."""
        return any(not self._loading(req) and not self._room_asked(req) for req, _ in self.pending)

    # ---- the reasons ----------------------------------------------------------------

    def _loading(self, req: GenerationRequest) -> bool:
        """Its restore source is being read on the reader thread (others keep decoding)."""
        future = self.tier.start_load(req.plan, self._wake)
        return future is not None and not future.done()

    def _anchor_in_capture(self, req: GenerationRequest) -> bool:
        """A plan waiting on an anchor that a request here (running, or pending and not yet
        judged in this pass) is yet to capture."""
        plan = req.plan
        if not plan.wait or self.tier.can_restore(plan.entry_id, plan.length):
            return False
        planned = [a.captures for a in self.active.values()]
        planned += [r.plan.captures for r, _ in self.pending if r is not req]
        return any(c.entry_id == plan.entry_id for caps in planned for c in caps)

    def _awaits_room(self, req: GenerationRequest) -> bool:
        """A plan that loads a file waits for the Orders that make room for its entry;
        they are asked for once, here."""
        plan = req.plan
        if not plan.load_from_disk or self.tier.disk_tier is None:
            return False
        if self.tier.can_restore(plan.entry_id, plan.length):
            return False
        key = _room_key(req)
        if key not in self._rooms:
            self._rooms[key] = None
            self.ledger.room(req.request_id, lambda orders: self._room_made(key, orders))
        seq = self._rooms.get(key)
        return seq is None or self.ledger.behind(seq)

    def _room_made(self, key: tuple[str, int | None], orders: Orders) -> None:
        """The answer to a room call: its frees apply now, and the plan may load."""
        if orders:
            self.tier.apply(orders)
        if key in self._rooms:
            self._rooms[key] = orders.seq

    def _room_asked(self, req: GenerationRequest) -> bool:
        """Its room's Orders are asked for and on their way (the answer rouses the loop)."""
        key = _room_key(req)
        return key in self._rooms and self._rooms[key] is None

    def _fits(self, req: GenerationRequest) -> bool:
        """Whether the request's tokens fit beside the running ones (an empty batch takes any)."""
        if self.max_batch_tokens is None or not self.active:
            return True
        return self.batch_tokens + tokens_needed(req) <= self.max_batch_tokens

    # ---- what the batch and the scheduler ask -----------------------------------------

    @property
    def batch_tokens(self) -> int:
        """Prompt plus max_tokens of the running sequences, plus the tokens of finished ones
        whose entries wait for their commit's Orders (still outside the RAM tier): what
        admission counts."""
        running = sum(tokens_needed(a.req) for a in self.active.values())
        return running + self.tier.staged_tokens

    def unblocks(self) -> dict[int, int]:
        """uid -> its prompt tokens (from its restore point) up to an anchor a pending
        request awaits: the prefills the scheduler runs first."""
        wanted = {req.plan.entry_id for req, _ in self.pending}
        out = {}
        for act in self.active.values():
            for point in act.captures:
                if point.kind == CaptureKind.ANCHOR and point.entry_id in wanted:
                    out[act.uid] = point.length - act.restore_length
                    break
        return out

    def will_capture(self, entry_id: int) -> bool:
        """Whether a request here (in the batch or pending) is yet to capture entry `entry_id`."""
        planned = [a.captures for a in self.active.values()]
        planned += [r.plan.captures for r, _ in self.pending]
        return any(c.entry_id == entry_id for caps in planned for c in caps)


def tokens_needed(req: GenerationRequest) -> int:
    """What one request takes of the batch's token bound: its prompt plus max_tokens, per
    branch (each of its n sequences holds the prompt's rows)."""
    return (len(req.tokens) + req.sampling.max_tokens) * req.sampling.n


def _room_key(req: GenerationRequest) -> tuple[str, int | None]:
    return (req.request_id, req.plan.new_entry_id)
