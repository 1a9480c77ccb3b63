"""CacheManager: the facade the cache-manager actor wraps (plan, commit, release, stats).

It validates messages, keeps the requests in flight (their restore pins and
allocated entry ids), counts hits, and hands the deciding to the mode's
policy (lineage.LineagePolicy or exact.ExactPolicy; none when the cache is
off). Its parts, each a module of its own: the config as the policy takes
it (engine.cache.knobs), the requests in flight and what they hold in the
tiers (engine.cache.flights), the numbered Orders and the frees waiting for
the next (orders.Outbox), the disk tier's unread files and lost writes
(engine.cache.disk_orders), and the counters and what is reported from them
(engine.cache.counts). What is left here is the calls' order: plan, commit,
replan, release, and how each composes those parts. Every entry it indexes
belongs to the model fingerprint it was built with; requests match only
entries of their own namespace.

Entry ids are ints allocated here: by plan() for the request's new entry and
for each separate-entry capture point (anchor, exact snapshot). Ids a
request never commits are freed at its commit or release (the model actor
may have stored a capture before the request stopped; freeing an id it does
not hold is a no-op there). An entry's disk file is named by its id, so ids
start above every id found in the cache directory.

The disk tier: the manager is handed a DiskIndex that the storage layer built
from the cache directory's headers (engine.storage.directory.open_directory,
which also holds the directory's lock). A plan that restores from a file adds its entry
to the RAM index once the plan is final (a plan made to wait on an anchor
restores from that anchor instead, and indexes nothing); the RAM evictions
that make room for it are ordered with the next Orders the manager hands out
(the model actor frees them then), and a free of that same entry still
waiting there is taken back. The model actor asks for those Orders (`room`)
before the file's entry enters its RAM tier, as a finished request's entry
enters it only with its commit's Orders: the tier holds no entry before the
frees that make its room, so it stays within the budget the index keeps
(entries plus pinned frees). Until a commit shows the model actor read that
file, every plan restoring from the entry says load_from_disk (the actor
reads the file if it does not hold the entry yet: requests are not always
admitted in plan order).

Ordering: every Orders handed out carries a sequence number, and every plan
the number of the last one before it (`RestorePlan.after_orders`); the model
actor restores a plan only after applying those Orders, so a free decided
before a plan never lands after the restore that re-reads the entry.

A restore the model actor cannot do (the entry or its state is gone, its
file will not load) comes back as a LostRestore: the entry leaves the RAM
index (and the disk index when its file failed), `restores_lost` counts it,
and the request is planned again (from the file, when it is sound).

A prompt sharing a long prefix with a request in flight (planned, not committed) may be
told to wait for it instead of being planned (`RestorePlan.after`; only when the caller
says it honours that, `PlanRequest.may_wait`): when that flight's prompt end (the prompt
extends it whole) or a point it is planned to capture within the shared part (not its
anchor: requests wait on an anchor mid-prefill, as above) restores the prompt at least
the divergence gain past its best stored point. Nothing is pinned or counted for such an
answer; the caller plans again, and the answer changes as soon as the flight commits or
ends. A request told to wait is not in flight, so none waits on it. When the prompt extends
the flight's prompt whole, the answer names an id (`after_entry`, the flight's from then
on) under which the flight's replica stores its prompt end early, while it decodes
(PromptEndCommit, indexed as a conversation entry): the waiter restores it then; the
flight's own commit frees it (its entry holds that point), a release leaves it stored.

A lost file write: engine.cache.disk_orders.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import partial

import numpy as np

from engine.cache.counts import Counts, anchor_uses, cache_stats
from engine.cache.disk_index import DiskIndex
from engine.cache.disk_orders import DiskOrders
from engine.cache.exact import ExactPolicy
from engine.cache.flights import Flight, Flights, waiting_plan
from engine.cache.index import Index
from engine.cache.kinds import CaptureKind, RestoreKind
from engine.cache.knobs import policy_config
from engine.cache.lineage import LineagePolicy
from engine.cache.message_points import check_starts
from engine.cache.messages import (
    AnchorCommit,
    AnchorUse,
    CacheStats,
    Commit,
    LostRestore,
    Orders,
    PlanRequest,
    PromptEndCommit,
    Release,
    Replanned,
    RestorePlan,
)
from engine.cache.misses import MissLog, shared_prefix
from engine.cache.orders import OrderBook, Outbox
from engine.cache.shared_rows import plan_prefix
from engine.cache.tokens import as_tokens
from engine.cache.tree import CacheTree, SessionEntries, cache_tree
from engine.config import CacheConfig

_POLICIES = {"lineage": LineagePolicy, "exact": ExactPolicy}


class CacheManager:
    """The cache policy behind one actor: no tensors, no locks (the actor serializes calls)."""

    def __init__(
        self,
        config: CacheConfig,
        fingerprint: str = "",
        has_state_layers: bool = True,
        disk_index: DiskIndex | None = None,
        first_id: int = 1,
    ) -> None:
        """`disk_index`: the disk tier's files (engine.storage.directory builds it from
        the cache directory); None keeps the disk tier off. `first_id`: allocate no id
        below it (a restarted manager starts above every id the model actor held)."""
        self.config = config = policy_config(config)
        self.fingerprint = fingerprint  # the disk tier keys files by it
        self.has_state_layers = has_state_layers
        self.index = Index()
        self.disk_index = disk_index if config.mode != "off" else None
        disk_max = disk_index.max_id if disk_index is not None else 0
        self._ids = itertools.count(max(disk_max + 1, first_id))
        self.flights = Flights()  # the requests planned, not committed or released yet
        self.counts = Counts()
        self.outbox = Outbox()
        self.disk = DiskOrders(self.disk_index)
        self.misses = MissLog()  # the earlier prompts, to explain a miss (engine.cache.misses)
        self.session_entries = SessionEntries()  # the entry each session's last commit stored
        policy = _POLICIES.get(config.mode)
        self._policy = None
        if policy is not None:
            self._policy = policy(
                config, self.index, self._new_id, has_state_layers, self.disk_index
            )
        # Lineage mode stores shared prefix rows once (engine.cache.shared_rows); exact
        # mode keeps whole snapshots, as it always did.
        self._shares_rows = isinstance(self._policy, LineagePolicy)

    def _new_id(self) -> int:
        return next(self._ids)

    def _held(self, entry_id: int) -> bool:
        """Whether a tier holds the entry (the RAM index, the disk index)."""
        disk = self.disk_index
        return entry_id in self.index or (disk is not None and entry_id in disk)

    def plan(self, req: PlanRequest) -> RestorePlan:
        """Choose the restore point and capture points for a prompt; pins the restore source.

        Raises ValueError for an empty prompt, an anchor_len outside [0, len],
        message starts out of order or outside the prompt, or a request id already
        in flight.
        """
        prompt = as_tokens(req.tokens, "prompt")
        if not 0 <= req.anchor_len <= len(prompt):
            raise ValueError(
                f"anchor_len {req.anchor_len} is outside the prompt's {len(prompt)} tokens"
            )
        check_starts(req.layout.starts, len(prompt))
        if self._policy is None:
            return RestorePlan(req.request_id, None, 0, RestoreKind.NONE, (), new_entry_id=None)
        if req.request_id in self.flights:
            raise ValueError(f"request {req.request_id!r} is already planned")
        plan = self._policy.plan(
            req.request_id,
            req.namespace,
            prompt,
            req.anchor_len,
            req.layout.spans(len(prompt)),
            req.layout.marked(len(prompt)),
        )
        if req.may_wait and self._shares_rows:
            restored = plan.length
            if any(c.kind == CaptureKind.ANCHOR for c in plan.captures):
                if self.flights.capturing(req.namespace, prompt[: req.anchor_len]) is not None:
                    restored = req.anchor_len  # it waits on that anchor mid-prefill (below)
            after = self._worth_waiting_for(req.namespace, prompt, restored)
            if after is not None:  # nothing kept: the policy's plan changed no index
                self.counts.flight_waits += 1
                early = self.flights.prompt_end_id(after, prompt, self._new_id)
                return RestorePlan(
                    req.request_id,
                    None,
                    0,
                    RestoreKind.NONE,
                    (),
                    new_entry_id=None,
                    after=after,
                    after_entry=early,
                )
        anchor = None
        if any(c.kind == CaptureKind.ANCHOR for c in plan.captures):
            anchor = prompt[: req.anchor_len].copy()
            capturing = self.flights.capturing(req.namespace, anchor)
            if capturing is not None:  # another request is prefilling this anchor: wait for it
                guard = self.config.guard_min_suffix
                plan = waiting_plan(plan, capturing, req.anchor_len, len(prompt), guard)
                anchor = None
        if plan.load_from_disk:  # the plan is final: only now does the file's entry enter RAM
            # Evicted at an earlier plan, its free not handed out: the actor still holds it.
            self._policy.adopt(plan.entry_id, self.outbox.take_back(plan.entry_id))
            self.disk.unread.add(plan.entry_id)
        elif plan.entry_id in self.disk.unread:
            plan = replace(plan, load_from_disk=True)
        plan = replace(
            plan,
            after_orders=self.outbox.seq,
            miss=self._explain(req, prompt, plan.length),
            shares=plan_prefix(self.index, plan) if self._shares_rows else None,
        )
        source = self.index.get(plan.entry_id)
        if source is not None:
            self.index.touch(source)
            self.index.pin(req.request_id, plan.entry_id, plan.length)
        if self.disk_index is not None and plan.entry_id is not None:
            self.disk_index.touch(plan.entry_id)
        if plan.load_from_disk:  # the file's entry is in the RAM index: make room
            victims = self._policy.evict(self.outbox.pending)
            self.counts.evictions += len(victims)
            self.outbox.hold(victims, self.index.deferred)
        self.flights[req.request_id] = Flight(
            req.namespace,
            prompt.copy(),
            req.anchor_len,
            plan,
            anchor,
            layout=req.layout,
            session=req.session,
        )
        self.counts.planned(plan, len(prompt))
        return plan

    def _worth_waiting_for(self, namespace: str, prompt: np.ndarray, restored: int) -> str | None:
        """The request in flight to wait for before planning `prompt` (None: plan it now).

        One whose commit would restore the prompt further than `restored` (its best
        stored point) by the divergence gain at least: the same threshold a divergence
        capture must clear (`divergence_min_gain`, or more where a checkpoint's state
        costs the KV of more tokens, `checkpoint_tokens`). Below it, prefilling the
        difference beside that request costs less than waiting for its commit. A request
        told to wait is not in flight (nothing planned, nothing pinned), so no two
        requests in flight ever wait on each other."""
        gain = max(self.config.divergence_min_gain, self._policy.checkpoint_tokens, 1)
        return self.flights.worth_waiting_for(
            namespace, prompt, restored, gain, not self.has_state_layers
        )

    def _explain(self, req: PlanRequest, prompt: np.ndarray, restored: int):
        """Why the prompt restores less than an earlier one offered (None: it does not)."""
        tiers = (self.index, self.disk_index) if self.disk_index is not None else (self.index,)
        stored = partial(shared_prefix, tiers, req.namespace, prompt, self.has_state_layers)
        miss = self.misses.explain(req.namespace, prompt, req.layout, restored, stored)
        if miss is not None:
            self.counts.miss_kinds[miss.kind] += 1
        return miss

    def commit_anchor(self, a: AnchorCommit) -> Orders:
        """Index an anchor captured mid-prefill, before its request ends (see AnchorCommit).

        Requests waiting on it are pinned to it now. Raises ValueError unless the
        request is in flight with that anchor capture planned.
        """
        if not isinstance(self._policy, LineagePolicy):
            return Orders()
        if isinstance(a, PromptEndCommit):
            return self._commit_prompt_end(a)
        flight = self.flights.get(a.request_id)
        planned = flight is not None and any(
            c.entry_id == a.entry_id and c.kind == CaptureKind.ANCHOR for c in flight.plan.captures
        )
        if not planned or a.entry_id in flight.committed:
            raise ValueError(f"anchor {a.entry_id} of {a.request_id!r} is not an open capture")
        orders = self._take_pending()
        self._policy.add_anchor(a, as_tokens(a.tokens, "anchor tokens").copy(), orders)
        flight.committed.add(a.entry_id)
        self._pin_waiters(a.entry_id)
        self._evict(orders)
        self.index.flush(orders)
        return self._hand_out(orders)

    def _commit_prompt_end(self, p: PromptEndCommit) -> Orders:
        """Index a request's prompt end stored early (PromptEndCommit) as a conversation entry
        of its own, which its commit supersedes. One asked for an earlier plan of it (its
        request ended meanwhile: released, replanned, its replica forgotten) is freed at once.
        ValueError when its tokens are not the request's prompt, or it is stored twice."""
        flight = self.flights.get(p.request_id)
        orders = self._take_pending()
        if flight is None or p.entry_id != flight.prompt_end:
            orders.free(p.entry_id)
            return self._hand_out(orders)
        tokens = as_tokens(p.tokens, "prompt end tokens").copy()
        if p.entry_id in flight.committed:
            raise ValueError(f"prompt end {p.entry_id} of {p.request_id!r} is stored twice")
        if not np.array_equal(tokens, flight.prompt):
            raise ValueError(f"prompt end {p.entry_id} of {p.request_id!r}: not its prompt")
        self._policy.add_prompt_end(p, tokens)
        flight.committed.add(p.entry_id)
        self._evict(orders)
        self.index.flush(orders)
        return self._hand_out(orders)

    def _pin_waiters(self, anchor_id: int | None) -> None:
        """Requests waiting on an anchor that is now indexed keep it readable (pins)."""
        if anchor_id is None or anchor_id not in self.index:
            return
        for request_id, other in self.flights.waiting_on(anchor_id):
            self.index.pin(request_id, anchor_id, other.plan.length)

    def _evict(self, orders: OrderBook) -> None:
        self.counts.evictions += len(self._policy.evict(orders))
        self.disk.evict(self.index, orders)

    def commit(self, c: Commit) -> Orders:
        """Index a finished request's entry and captures; answer with the actor's orders.

        The commit echoes the plan's restore point, or (None, 0) when the actor
        found it gone and prefilled cold. Raises ValueError (and changes
        nothing) when the commit does not match its plan.
        """
        if self._policy is None:
            return Orders()
        tokens = self.flights.validated_tokens(c)
        flight = self.flights.pop(c.request_id)
        self.index.unpin(c.request_id)
        orders = self._take_pending()
        if flight.plan.entry_id is not None and c.restored_from is None:
            # The actor prefilled cold without asking for a new plan (a second loss).
            self._lost(flight.plan, orders)
        elif flight.plan.load_from_disk:
            self.disk.unread.discard(flight.plan.entry_id)
        self._policy.commit(c, tokens, orders)
        self.misses.record(c.namespace, tokens, flight.layout)
        self.session_entries.committed(flight.namespace, flight.session, c.entry_id, self._held)
        for point in c.captures:
            self._pin_waiters(point.entry_id)
        taken = {p.entry_id for p in c.captures} | flight.committed
        for entry_id in flight.allocated:
            if entry_id != c.entry_id and entry_id not in taken:
                orders.free(entry_id)  # prefill stopped before this capture
        if flight.prompt_end in flight.committed and flight.prompt_end in self.index:
            # Its early prompt end: the new entry holds that point now (once a plan
            # restoring there lets it go); a waiter that committed first absorbed it.
            self.index.free(flight.prompt_end, orders)
        self._evict(orders)
        self.index.flush(orders)
        self._forget_unread()
        return self._hand_out(orders)

    def replan(self, lost: LostRestore) -> Replanned:
        """A restore the model actor could not do: forget the source in RAM, plan again.

        The old plan's ids are freed and its pin dropped; the new plan has
        fresh ids and may restore from the source's file (load_from_disk),
        unless that file is what failed. Raises ValueError unless `lost`
        names the restore point of a request in flight.
        """
        if self._policy is None:
            return Replanned(None, Orders())
        flight = self.flights.get(lost.request_id)
        if flight is None:
            return Replanned(None, self._hand_out(self._take_pending()))
        plan = flight.plan
        if (lost.entry_id, lost.length) != (plan.entry_id, plan.length) or flight.committed:
            raise ValueError(
                f"lost restore {lost} does not match the plan of {lost.request_id!r} "
                f"({plan.entry_id}@{plan.length})"
            )
        del self.flights[lost.request_id]
        self.index.unpin(lost.request_id)
        self.counts.planned(plan, flight.prompt_len, -1)  # counted once, by its new plan
        pending = self.outbox.pending
        self._lost(plan, pending, file_failed=lost.load_failed)
        for entry_id in flight.allocated:
            pending.free(entry_id)
        self.outbox.hold(self.index.flush(pending), self.index.deferred)
        self._forget_unread()
        request = PlanRequest(
            lost.request_id,
            flight.prompt,
            flight.anchor_len,
            flight.namespace,
            session=flight.session,
            layout=flight.layout,
        )
        new = self.plan(request)  # may take back the source's free: its file is read again
        orders = self._hand_out(self._take_pending())
        new = replace(new, after_orders=orders.seq)
        self.flights[lost.request_id] = replace(self.flights[lost.request_id], plan=new)
        return Replanned(new, orders)

    def files_lost(self, entry_ids) -> list[int]:
        """Writes the model actor reports lost: their files leave the disk index. The ids
        it indexed (others were evicted or superseded meanwhile, or never indexed)."""
        return self.disk.files_lost(entry_ids)

    def files_written(self, written, ours=None) -> Orders:
        """Files the model actor wrote, (id, bytes) each: the disk budget counts a file at
        its bytes on disk from now on, no longer at the estimate made when it was ordered.

        A write done is the sign that the disk takes writes again: the entries still in
        RAM whose writes were lost are ordered written now (the Orders returned), so a
        full disk loses files only for the entries that left RAM meanwhile."""
        written = list(written)
        self.file_sizes(written)
        if not written:
            return Orders()
        lost = self.disk.write_lost(self.index, ours)
        orders = OrderBook() if lost is None else lost
        evicted = self.disk.evictions
        self.disk.evict(self.index, orders)  # a file larger than its estimate
        if lost is None and self.disk.evictions == evicted:
            return Orders()
        return self._hand_out(orders)

    def write_lost(self, ours=None) -> Orders:
        """Order written again the entries still in RAM whose writes were lost (the disk
        takes writes again, or may: the writer's pause after a full disk ended); `ours`:
        only the ids it says are that writer's (the others wait for their own writer)."""
        orders = self.disk.write_lost(self.index, ours)
        return Orders() if orders is None else self._hand_out(orders)

    def file_sizes(self, sizes) -> None:
        """(id, bytes) of files on disk: the disk budget counts each one still indexed at
        its bytes, no longer at the estimate made when its write was ordered."""
        self.disk.file_sizes(sizes)

    def prompt_len(self, request_id: str) -> int:
        """The prompt length of a request in flight."""
        return self.flights[request_id].prompt_len

    def _lost(self, plan: RestorePlan, orders: OrderBook, file_failed: bool | None = None) -> None:
        """Count a restore that could not be done; its source leaves the RAM index (and the
        disk index when its file failed)."""
        self.counts.restores_lost += 1
        entry_id = plan.entry_id
        if file_failed is None:
            file_failed = plan.load_from_disk
        if plan.load_from_disk:
            self.disk.unread.discard(entry_id)
        if self.index.get(entry_id) is not None:
            self.index.free(entry_id, orders)
        if file_failed:
            self.disk.file_failed(entry_id)

    def _hand_out(self, orders: OrderBook) -> Orders:
        return self.outbox.hand_out(orders)

    def _forget_unread(self) -> None:
        self.disk.forget_unread(self.index)

    def _take_pending(self) -> OrderBook:
        return self.outbox.take()

    def room(self, request_id: str) -> Orders:
        """The Orders that make room for a plan's file load, asked by the model actor before
        the file's entry enters its RAM tier: the evictions plans decided and did not hand
        out yet (the plan adopted the file's entry and evicted for it), numbered."""
        if self._policy is None:
            return Orders()
        return self._hand_out(self._take_pending())

    @property
    def unread(self) -> frozenset[int]:
        """Ids in the RAM index from a file the model actor may not have read yet."""
        return frozenset(self.disk.unread)

    @property
    def pending_orders(self) -> Orders:
        """Orders decided at a plan, not handed out yet (the next commit or release does)."""
        return self.outbox.pending.build()

    def release(self, r: Release) -> Orders:
        """End a request without a commit: unpin, free what it stored and every id it was given.

        Releasing an unknown request only frees `r.stored`. Raises ValueError when
        `r.stored` names an entry the index still holds.
        """
        if self._policy is None:
            return Orders()
        held = [i for i in r.stored if i in self.index or i in self.index.deferred]
        if held:
            raise ValueError(f"release {r.request_id!r} would free indexed entries {held}")
        orders = self._take_pending()
        self._give_back(r.request_id, orders)
        for entry_id in r.stored:
            orders.free(entry_id)
        self.index.flush(orders)
        self._forget_unread()
        return self._hand_out(orders)

    def forget(self, request_ids, entry_ids) -> Orders:
        """A replica is gone (or will be reset): its requests are given back as if released
        and the entries only it held leave the RAM index (their files stay). One numbered
        Orders: the frees that waited for their pins, for the other holders."""
        if self._policy is None:
            return Orders()
        orders = self._take_pending()
        for request_id in request_ids:
            self._give_back(request_id, orders)
        for entry_id in entry_ids:
            if entry_id in self.index:
                self.index.free(entry_id, orders)
        self.index.flush(orders)
        self._forget_unread()
        return self._hand_out(orders)

    def _give_back(self, request_id: str, orders: OrderBook) -> None:
        """A request in flight ends storing nothing: unpinned, its ids freed (none if unknown)."""
        flight = self.flights.pop(request_id, None)
        self.index.unpin(request_id)
        allocated = [i for i in flight.allocated if i not in flight.committed] if flight else []
        for entry_id in allocated:
            orders.free(entry_id)

    def stats(self) -> CacheStats:
        """Counters for the CacheStats RPC (all zero when the cache is off)."""
        if self._policy is None:
            return CacheStats(mode=self.config.mode, entries=0, anchors=0)
        disk = self.disk
        return cache_stats(
            self.config.mode,
            self.index,
            self.disk_index,
            self.counts,
            disk.evictions,
            disk.writes_lost,
        )

    def tree(self, namespace: str | None = None) -> CacheTree:
        """The entries of `namespace` (None: all) in RAM and on disk (engine.cache.tree)."""
        files = self.disk_index.files.values() if self.disk_index else ()
        disk = [f.entry for f in files if f.entry is not None]
        return cache_tree(
            self.config.mode, self.index.entries(), disk, self.session_entries, namespace
        )

    def anchors(self) -> list[AnchorUse]:
        """Each anchor in RAM with the number of conversation entries that extend it."""
        return anchor_uses(self.index)

    def check_invariants(self) -> None:
        """Assert the index's, the policy's and the in-flight requests' invariants."""
        self.index.check()
        self.misses.check()
        if self._policy is None:
            assert not self.index.entries() and not self.flights
            return
        self._policy.check()
        self.flights.check(self.index, self.disk_index, self.has_state_layers)
