"""The driver: requests through a real CacheManager and the fake model actor.

`Driver` runs requests through a CacheManager and a FakeModelActor and, after
every call, checks the manager's invariants and that the actor holds exactly
what the index says (plus the entries whose free waits for a pin); the bytes
the actor holds stay within the RAM budget at every step, Orders in transit
included. A plan that loads a file first gets the Orders that make room for
it (`CacheManager.room`).

Orders may travel late, as they do between actors: the driver reaches the
manager through `HeldLink`, a CacheLink whose answers queue up until
`deliver()` while `hold` is set (or while earlier ones are still in transit:
they arrive in order), and plans made meanwhile reach the actor at once. Its
calls go through the runtime's own `OrderLedger` (engine.runtime.ordering),
so the actor restores a plan by the model actor's rule, in the same code:
only once it applied every Orders up to `plan.after_orders`, or once no call
of its own is unanswered; a commit of a plan not restored yet first waits
for them. It knows nothing of the disk tier (tests.fakes.disk).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from engine.cache import CacheManager
from engine.cache.messages import (
    AnchorCommit,
    Commit,
    LostRestore,
    Orders,
    PlanRequest,
    PromptEndCommit,
    PromptLayout,
    Release,
    RestorePlan,
)
from engine.config import CacheConfig
from engine.runtime.ordering import OrderLedger
from tests.fakes.model_actor import KVPT, STATE, FakeModelActor, tokens


class HeldLink:
    """A CacheLink to an in-process CacheManager whose answers may travel late.

    An answer reaches its callback at once, or, while `hold` is set or earlier
    answers are still in transit (they arrive in order), once `deliver()`
    hands it over. `last` is the manager's latest answer, delivered or not.
    """

    def __init__(self, manager: CacheManager):
        self.manager = manager
        self.hold = False
        self.in_transit: list[tuple[Orders, Callable[[], None]]] = []
        self.last = None

    def commit(self, commit, on_orders) -> None:
        self._answer(self.manager.commit(commit), on_orders)

    def commit_anchor(self, anchor, on_orders) -> None:
        self._answer(self.manager.commit_anchor(anchor), on_orders)

    def release(self, release, on_orders) -> None:
        self._answer(self.manager.release(release), on_orders)

    def room(self, request_id, on_orders) -> None:
        self._answer(self.manager.room(request_id), on_orders)

    def replan(self, lost, on_replanned) -> None:
        replanned = self.manager.replan(lost)
        self.last = replanned
        self._send(replanned.orders, lambda: on_replanned(replanned))

    def deliver(self, count: int | None = None) -> None:
        """The first `count` answers in transit (all when None) reach their callbacks."""
        count = len(self.in_transit) if count is None else count
        arrived, self.in_transit = self.in_transit[:count], self.in_transit[count:]
        for _, arrive in arrived:
            arrive()

    def overtake(self, index: int) -> None:
        """The answer at `index` in transit arrives now, ahead of the ones before it (two
        replies of one actor, or a reply and Orders sent unasked, may cross)."""
        _, arrive = self.in_transit.pop(index)
        arrive()

    def _answer(self, orders: Orders, on_orders) -> None:
        self.last = orders
        self._send(orders, lambda: on_orders(orders))

    def _send(self, orders: Orders, arrive: Callable[[], None]) -> None:
        if self.hold or self.in_transit:
            self.in_transit.append((orders, arrive))
        else:
            arrive()


class Driver:
    """Runs requests through a CacheManager and a FakeModelActor, checking both after every call."""

    def __init__(
        self, config: CacheConfig | None = None, state_layers: bool = True, **knobs
    ) -> None:
        config = config or CacheConfig(**knobs)
        # The disk tier stays off here (it would open the user's cache directory);
        # DiskDriver turns it on in a directory of its own.
        manager = CacheManager(config, fingerprint="fake", has_state_layers=state_layers)
        self._start(manager, FakeModelActor(state_layers=state_layers))

    def _start(self, manager: CacheManager, actor: FakeModelActor) -> None:
        self.manager = manager
        self.actor = actor
        actor.shared_rows_min = manager.config.shared_rows_min  # the model actor's setting
        self.link = HeldLink(manager)
        self.ledger = OrderLedger(self.link)  # the model actor's own ordering rule
        self._requests: dict[str, tuple[RestorePlan, np.ndarray, str]] = {}
        self._restored: set[str] = set()
        self._early: dict[str, set[int]] = {}  # anchors committed mid-prefill, by request
        self._serial = 0
        # request id -> seq of the Orders making its room (None: asked, not answered)
        self._rooms: dict[str, int | None] = {}

    @property
    def hold(self) -> bool:
        """Whether the manager's answers queue up until `deliver()` (see the module doc)."""
        return self.link.hold

    @hold.setter
    def hold(self, value: bool) -> None:
        self.link.hold = value

    @property
    def in_transit(self) -> list[Orders]:
        """The Orders answered and not delivered yet, in order."""
        return [orders for orders, _ in self.link.in_transit]

    def plan(
        self,
        prompt,
        anchor_len: int = 0,
        namespace: str = "",
        request_id: str | None = None,
        layout: PromptLayout | None = None,
        may_wait: bool = False,
    ) -> RestorePlan:
        """Plan `prompt`; `layout`: where its messages start (PlanRequest.layout).
        `may_wait`: the manager may answer "wait for a request in flight" (plan.after), an
        answer that plans nothing: it is not kept, and the caller plans again."""
        if request_id is None:
            self._serial += 1
            request_id = f"r{self._serial}"
        prompt = tokens(prompt)
        layout = layout or PromptLayout()
        plan = self.manager.plan(
            PlanRequest(request_id, prompt, anchor_len, namespace, layout=layout, may_wait=may_wait)
        )
        if not plan.after:
            self._requests[request_id] = (plan, prompt, namespace)
        self.check()
        return plan

    def lose(self, request_id: str, load_failed: bool = False) -> RestorePlan:
        """The actor finds the plan's restore point gone at admission: it asks for a new plan
        (known here at once; its Orders may travel late)."""
        plan, prompt, namespace = self._requests[request_id]
        lost = LostRestore(request_id, plan.entry_id, plan.length, load_failed)
        self.ledger.replan(lost, lambda replanned: self.actor.apply(replanned.orders))
        replanned = self.link.last
        self._rooms.pop(request_id, None)  # the new plan asks for its own
        self._requests[request_id] = (replanned.plan, prompt, namespace)
        self.check()
        return replanned.plan

    def planned(self, request_id: str) -> RestorePlan:
        """The plan of a request not yet committed or released."""
        return self._requests[request_id][0]

    def _entering(self, key: str | None) -> Callable[[Orders], None]:
        """The callback of a commit's answer: the entries staged under `key` enter the
        actor, then the Orders apply."""

        def arrived(orders: Orders) -> None:
            self.actor.enter(key)
            self.actor.apply(orders)

        return arrived

    def deliver(self, count: int | None = None) -> None:
        """The first `count` Orders in transit (all when None) reach the actor, in order."""
        self.link.deliver(count)
        self.check()

    def room(self, request_id: str) -> bool:
        """A plan about to load a file asks for the Orders that make room for its entry
        (once); whether they are applied."""
        if request_id not in self._rooms:
            self._rooms[request_id] = None

            def made(orders: Orders) -> None:
                self.actor.apply(orders)
                if request_id in self._rooms:
                    self._rooms[request_id] = orders.seq

            self.ledger.room(request_id, made)
        seq = self._rooms[request_id]
        return seq is not None and not self.ledger.behind(seq)

    def ready(self, plan: RestorePlan) -> bool:
        """Whether the actor may restore `plan`: no Orders before it can still be on their way."""
        return not self.ledger.behind(plan.after_orders)

    def restore(self, request_id: str) -> bool:
        """The model actor takes the restore point (it may do so long after the plan).

        False while it must wait: for Orders still in transit, or for the anchor
        it waits on.
        """
        plan, prompt, _ = self._requests[request_id]
        if not self.ready(plan):
            return False  # Orders decided before the plan are still on their way
        if plan.wait and plan.entry_id not in self.actor.stored:
            return False  # the actor holds the request until the anchor it waits on is stored
        self.actor.restore(plan, prompt)
        self._restored.add(request_id)
        return True

    def capture_anchor(self, request_id: str) -> Orders | None:
        """The request's prefill reaches its anchor: stored and committed at once (AnchorCommit)."""
        plan, prompt, namespace = self._requests[request_id]
        early = self._early.setdefault(request_id, set())
        point = next(
            (p for p in plan.captures if p.kind == "anchor" and p.entry_id not in early), None
        )
        if point is None:
            return None
        key = f"{request_id}#{point.entry_id}"
        self.actor.store_capture(point.entry_id, prompt, point.length, key)
        anchor = AnchorCommit(
            request_id,
            namespace,
            point.entry_id,
            prompt[: point.length],
            KVPT,
            STATE if self.actor.state_layers else 0,
        )
        self.ledger.commit_anchor(anchor, self._entering(key))
        early.add(point.entry_id)
        self.check()
        return self.link.last

    def store_prompt_end(self, request_id: str, entry_id: int, prompt=None) -> Orders:
        """The request's replica, asked by a waiter, stores its prompt end under `entry_id`
        while the request decodes, and commits it at once (PromptEndCommit). `prompt`: the
        request's, when it is not in flight here any more (its release overtook it)."""
        if prompt is None:
            _, prompt, namespace = self._requests[request_id]
        else:
            prompt, namespace = tokens(prompt), ""
        key = f"{request_id}#{entry_id}"
        self.actor._store(entry_id, prompt, {len(prompt)}, key, logits_at=len(prompt))
        early = PromptEndCommit(
            request_id,
            namespace,
            entry_id,
            prompt,
            KVPT,
            STATE if self.actor.state_layers else 0,
            logits_at=len(prompt),
            logits_bytes=self.actor.logits_bytes,
        )
        self.ledger.commit_anchor(early, self._entering(key))
        self.check()
        return self.link.last

    def commit(
        self,
        request_id: str,
        reply=(),
        taken: int | None = None,
        cold: bool = False,
        upto: int | None = None,
    ) -> Orders:
        """Restore (if not yet), prefill, decode `reply`, commit, apply the orders.

        `cold`: the actor found the restore point gone and prefilled from scratch.
        `upto`: cancelled in prefill after that many tokens (see FakeModelActor.prefill).
        """
        plan = self._requests[request_id][0]
        if request_id not in self._restored and not self.ready(plan):
            self.deliver()  # the actor waits for them before it restores
        if plan.wait and plan.entry_id not in self.actor.stored:
            cold = True  # the anchor it waited on was never captured
        if request_id not in self._restored and not cold:
            self.restore(request_id)
        plan, prompt, namespace = self._requests.pop(request_id)
        self._restored.discard(request_id)
        self._rooms.pop(request_id, None)
        early = self._early.pop(request_id, set())
        stored_early = [(p.length, p.entry_id) for p in plan.captures if p.entry_id in early]
        anchor = max(stored_early, default=None)
        plan = replace(plan, captures=tuple(p for p in plan.captures if p.entry_id not in early))
        if cold:
            plan = replace(plan, entry_id=None, length=0, kind="none")
        anchor = (anchor[1], anchor[0]) if anchor is not None else None
        commit = self.actor.prefill(plan, prompt, tokens(reply), taken, upto, anchor)
        if commit is None:
            commit = _off_commit(plan, prompt, namespace)
        self.ledger.commit(replace(commit, namespace=namespace), self._entering(request_id))
        self.check()
        return self.link.last

    def release(self, request_id: str, taken: int = 0) -> Orders:
        """Cancel a request after its prefill took `taken` capture points; release its stores."""
        if taken and request_id not in self._restored:
            if not self.ready(self._requests[request_id][0]):
                self.deliver()
            self.restore(request_id)
        plan, prompt, _ = self._requests.pop(request_id)
        self._restored.discard(request_id)
        self._rooms.pop(request_id, None)
        early = self._early.pop(request_id, set())
        stored = []
        for point in [p for p in plan.captures if p.entry_id not in early][:taken]:
            if point.entry_id is not None:
                self.actor.store_capture(point.entry_id, prompt, point.length, request_id)
                stored.append(point.entry_id)
        self.ledger.release(Release(request_id, tuple(stored)), self._entering(request_id))
        self.check()
        return self.link.last

    def turn(self, prompt, reply=(), anchor_len: int = 0, namespace: str = "", layout=None):
        """One whole request: plan, restore, prefill, commit. Returns (plan, orders)."""
        plan = self.plan(prompt, anchor_len, namespace, layout=layout)
        return plan, self.commit(plan.request_id, reply)

    def entry(self, entry_id: int):
        return self.manager.index.get(entry_id)

    def checkpoints(self, entry_id: int) -> dict[int, str]:
        """Length -> kind of an indexed entry's checkpoints."""
        return {n: c.kind for n, c in sorted(self.entry(entry_id).checkpoints.items())}

    def check(self) -> None:
        """The manager's invariants, the actor within the RAM budget (always), and holding
        exactly the index plus deferred frees (once every Orders in transit is delivered)."""
        self.manager.check_invariants()
        self.check_budget()
        if self.link.in_transit:
            return
        index = self.manager.index
        for entry in index.entries():
            held = self.actor.stored.get(entry.id)
            assert held is not None, f"indexed entry {entry.id} is not held by the actor"
            assert np.array_equal(held.tokens, entry.tokens)
            assert held.states == set(entry.checkpoints) | {entry.length}, (entry.id, held.states)
            if entry.logits_at is not None:
                assert entry.logits_at in held.logits, (entry.id, entry.logits_at)
            assert self.actor.bytes_of(entry.id) == entry.nbytes, (entry.id, "bytes differ")
        expected = {e.id for e in index.entries()} | set(index.deferred)
        assert set(self.actor.stored) == expected, (sorted(self.actor.stored), sorted(expected))

    def check_budget(self) -> None:
        """What the actor holds never exceeds the RAM budget, Orders in transit or not."""
        budget = self.manager.config.ram_budget
        assert self.actor.nbytes <= budget, (self.actor.nbytes, budget)


def _off_commit(plan: RestorePlan, prompt: np.ndarray, namespace: str) -> Commit:
    """What an actor would send when the cache is off (the manager ignores it)."""
    return Commit(plan.request_id, namespace, 0, prompt, len(prompt), None, 0, (), KVPT, STATE)
