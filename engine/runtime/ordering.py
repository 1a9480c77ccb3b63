"""The ordering protocol between a model replica and the cache manager. Plain Python.

The manager numbers every Orders it hands out (`Orders.seq`: 1, 2, ...), and
every plan names the last Orders handed out before it (`after_orders`). A plan
reaches the replica through the front end, by another path than the Orders,
so the two race: the replica restores a plan only once it applied every
Orders up to that number, because a free decided before the plan must not
land after the restore that re-reads the entry.

`OrderLedger` keeps that account for one replica: the cache calls sent and
not yet answered (one counter, raised in `_sent` and lowered in `_answered`,
nowhere else), and the Orders applied (`applied`: every number up to it; the
numbers seen above it wait for the gap to close). Numbers go to other
replicas too (the manager numbers Orders for the whole engine), so a gap may
never close here: once no call is unanswered, nothing this replica waits for
is on its way, and `applied` moves up to the highest number seen.

It knows Orders only as numbers and sends calls through a `CacheLink`; it
does not apply them (the caller does, in the same loop-thread call that hands
it the answer) and knows nothing of tensors, the tier or MLX. The runtime's
Generator and the policy tests' fake driver (tests/fakes/driver.py) both use it.
"""

from __future__ import annotations

from typing import Callable, Protocol

from engine.cache.messages import AnchorCommit, Commit, LostRestore, Orders, Release, Replanned

OnOrders = Callable[[Orders], None]
OnReplanned = Callable[[Replanned], None]


class CacheLink(Protocol):
    """How a replica reaches the cache manager. Each call answers with Orders, handed to
    `on_orders` on the replica's own thread (never re-entrantly inside a step for a remote
    manager; at once for an in-process one)."""

    def commit(self, commit: Commit, on_orders: OnOrders) -> None: ...

    def commit_anchor(self, anchor: AnchorCommit, on_orders: OnOrders) -> None: ...

    def release(self, release: Release, on_orders: OnOrders) -> None: ...

    def replan(self, lost: LostRestore, on_replanned: OnReplanned) -> None: ...

    def room(self, request_id: str, on_orders: OnOrders) -> None: ...  # before a file load


class OrderLedger:
    """A CacheLink that counts its calls until answered and numbers the Orders they bring.

    Each call goes through the wrapped `link`; its answer is counted and numbered
    here first, then handed to the caller's callback, which applies the Orders.
    """

    def __init__(self, link: CacheLink):
        self.link = link
        self.applied = 0  # every Orders numbered up to this one is applied
        self._seen: set[int] = set()  # numbers applied above `applied` (a gap below them)
        self._unanswered = 0  # calls sent whose answer has not come back
        self._resets = 0  # answers to calls sent before the last reset count for nothing

    # ---- calls out: each counted until its answer --------------------------------

    def commit(self, commit: Commit, on_orders: OnOrders) -> None:
        self.link.commit(commit, self._sent(on_orders))

    def commit_anchor(self, anchor: AnchorCommit, on_orders: OnOrders) -> None:
        self.link.commit_anchor(anchor, self._sent(on_orders))

    def release(self, release: Release, on_orders: OnOrders) -> None:
        self.link.release(release, self._sent(on_orders))

    def room(self, request_id: str, on_orders: OnOrders) -> None:
        self.link.room(request_id, self._sent(on_orders))

    def replan(self, lost: LostRestore, on_replanned: OnReplanned) -> None:
        answer = self._sent(lambda orders: None)
        self.link.replan(
            lost, lambda replanned: (answer(replanned.orders), on_replanned(replanned))
        )

    # ---- Orders in -------------------------------------------------------------------

    def received(self, orders: Orders) -> None:
        """Orders that answer no call of ours (decided at another replica's call, or the
        late answer of a call already answered empty): numbered, not counted."""
        self._number(orders.seq)

    def behind(self, seq: int) -> bool:
        """Whether Orders numbered up to `seq` may still be on their way here."""
        return seq > self.applied and self._unanswered > 0

    @property
    def unanswered(self) -> int:
        return self._unanswered

    def reset(self) -> None:
        """The manager restarted: it numbers its Orders anew, and the answers still on their
        way are not counted."""
        self.applied, self._seen, self._unanswered = 0, set(), 0
        self._resets += 1

    # ---- the one place each changes ------------------------------------------------

    def _sent(self, on_orders: OnOrders) -> OnOrders:
        """Count one call as sent; the callback its answer must come through."""
        self._unanswered += 1
        resets = self._resets

        def answered(orders: Orders) -> None:
            if resets == self._resets:
                self._answered(orders)
            on_orders(orders)

        return answered

    def _answered(self, orders: Orders) -> None:
        self._unanswered -= 1
        assert self._unanswered >= 0, "an answer to a call never sent"
        self._number(orders.seq)

    def _number(self, seq: int) -> None:
        if seq:
            self._seen.add(seq)
            while self.applied + 1 in self._seen:
                self.applied += 1
                self._seen.discard(self.applied)
        if not self._unanswered and self._seen:  # the rest went to another replica
            self.applied = max(self.applied, *self._seen)
            self._seen.clear()
