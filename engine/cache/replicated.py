"""ReplicatedCache: a CacheManager and its Replicas, the facade the cache-manager actor wraps.

Each call goes to the manager, and its answer through the replicas' bookkeeping
(engine.cache.replicas): a plan comes back routed to a replica; a commit, an anchor
commit or a release comes back as Orders per replica (the caller's own, plus those
for the other holders of what the orders touch). It knows nothing of Ray: the actor
shell delivers the other replicas' Orders.

Plain Python (no MLX, no Ray), like the rest of engine.cache.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from engine.cache.manager import CacheManager
from engine.cache.messages import (
    AnchorCommit,
    CacheAudit,
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
from engine.cache.replicas import DEFAULT_THRESHOLD, Replicas


class ReplicatedCache:
    """A CacheManager plus Replicas: plans come back routed, orders come back per replica."""

    def __init__(self, manager: CacheManager, replicas: int, threshold: int = DEFAULT_THRESHOLD):
        self.manager = manager
        self.replicas = Replicas(replicas, threshold)

    def plan(self, req: PlanRequest) -> RestorePlan:
        """The manager's plan, placed on a replica. LookupError when none is alive."""
        if not set(self.replicas.alive()) - set(req.exclude):
            raise LookupError("no model replica is alive")
        plan = self.manager.plan(req)
        if plan.after:  # not a plan: the request asks again, and is placed then
            flight = self.replicas.flights.get(plan.after)
            if flight is None:
                return plan
            if plan.after_entry is not None:  # that request's replica will store it
                self.replicas.holders.setdefault(plan.after_entry, set()).add(flight.replica)
            return replace(plan, replica=flight.replica)  # where to ask for its prompt end
        source = self.manager.index.get(plan.entry_id)
        nbytes = source.nbytes if source is not None else 0
        session = (req.namespace, req.session) if req.session else None
        return self.replicas.route(
            req.request_id, plan, len(req.tokens), req.exclude, nbytes, session
        )

    def prefilled(self, request_id: str) -> None:
        self.replicas.prefilled(request_id)

    def commit(self, c: Commit) -> dict[int, Orders]:
        flight = self.replicas.flights.get(c.request_id)
        orders = self.manager.commit(c)
        per_replica = self._split(orders, self.replicas.finish(c.request_id))
        if flight is not None and c.restored_from is None:  # a cold fallback: the file failed?
            self._unfiled(flight.plan.entry_id)
        return per_replica

    def _unfiled(self, entry_id) -> None:
        """A restore source whose file would not load leaves the disk index with no delete
        ordered (DiskOrders.file_failed): its writer forgets it too, or `writers` and
        `durable` would keep an id for every such file ever met. Called after the call's
        Orders are split: a file that left the index by a delete (evicted meanwhile) must
        reach its own writer, which `split` finds in `writers`."""
        disk = self.manager.disk_index
        if entry_id is not None and (disk is None or entry_id not in disk):
            self.replicas.forget_file(entry_id)

    def commit_anchor(self, a: AnchorCommit, replica: int | None = None) -> dict[int, Orders]:
        """An anchor, or a prompt end stored early (PromptEndCommit), from `replica` (None:
        the request's): it holds the entry, so the free of one nobody indexes reaches it."""
        flight = self.replicas.flights.get(a.request_id)
        caller = replica if replica is not None else flight.replica if flight else None
        if isinstance(a, PromptEndCommit) and caller is not None:
            self.replicas.holders.setdefault(a.entry_id, set()).add(caller)
        orders = self.manager.commit_anchor(a)
        return self._split(orders, caller)

    def room(self, request_id: str, replica: int) -> dict[int, Orders]:
        """The Orders that make room for a file `replica` is about to load, per replica."""
        return self._split(self.manager.room(request_id), replica)

    def release(self, r: Release) -> dict[int, Orders]:
        orders = self.manager.release(r)
        return self._split(orders, self.replicas.finish(r.request_id))

    def _split(self, orders: Orders, caller: int | None) -> dict[int, Orders]:
        """Orders per replica; the disk index forgets the writes nobody could do."""
        per_replica = self.replicas.split(orders, caller)
        unwritten, self.replicas.unwritten = self.replicas.unwritten, []
        self.manager.files_lost(unwritten)
        return per_replica

    def replan(self, lost: LostRestore, replica: int) -> tuple[Replanned, dict[int, Orders]]:
        """A replica found a plan's restore point gone: the manager plans the request again,
        and it stays on that replica (fetching the new source from a holder if need be).

        The replica stays a holder of the lost entry until its free (it may hold the
        entry without the state the plan named, or with other tokens)."""
        flight = self.replicas.flights.pop(lost.request_id, None)
        if flight is not None:
            self.replicas.replicas[flight.replica].load -= flight.queued
        replanned = self.manager.replan(lost)
        per_replica = self._split(replanned.orders, replica)
        self._unfiled(lost.entry_id)
        if replanned.plan is None:
            return replanned, per_replica
        plan = replanned.plan
        source = self.manager.index.get(plan.entry_id)
        others = [r for r in range(self.replicas.count) if r != replica]
        prompt = self.manager.prompt_len(lost.request_id)
        nbytes = source.nbytes if source is not None else 0
        plan = self.replicas.route(lost.request_id, plan, prompt, others, nbytes)
        return replace(replanned, plan=plan), per_replica

    def lost(self, replica: int) -> dict[int, Orders]:
        """A replica died or stopped answering: the entries only it held leave the RAM index
        (their files stay), and the requests planned on it are given back (unpinned, their
        ids freed), as if released: it is reset before it serves again.

        Returns the Orders for the others (frees of entries whose free waited).
        """
        orphans, requests = self.replicas.lost(replica)
        return self._split(self.manager.forget(requests, orphans), None)

    def files_of(self, replica: int) -> list[int]:
        """The indexed files whose write was ordered to `replica`'s writer."""
        disk = self.manager.disk_index
        writers = self.replicas.writers
        return [i for i, w in writers.items() if w == replica and disk is not None and i in disk]

    def restarted(self, replica: int, on_disk: Collection[int]) -> tuple[list[int], list[int]]:
        """Replica `replica` restarted: its old writer's queue died with it. `on_disk`: the
        ids of the entry files in its machine's directory now.

        Returns (never written, orphans): the indexed files that writer was to write and
        that are not on disk (the caller reports them lost), and the files on disk the
        disk index does not hold. Every file leaves the disk index only when its delete is
        ordered (an absorbed source's, an evicted one's) or when it is gone, so those
        are deletes that a dead writer never did: the caller deletes them.
        """
        disk = self.manager.disk_index
        if disk is None:
            return [], []
        unwritten = [i for i in self.files_of(replica) if i not in on_disk]
        orphans = sorted(i for i in on_disk if i not in disk)
        return unwritten, orphans

    def files_lost(self, entry_ids) -> list[int]:
        """Writes a replica reports lost: the disk index forgets them, and their writer."""
        for entry_id in entry_ids:
            self.replicas.forget_file(entry_id)
        return self.manager.files_lost(entry_ids)

    def revived(self, replica: int, machine: str | None = None) -> None:
        self.replicas.revived(replica, machine)

    def files_written(self, written, replica: int) -> dict[int, Orders]:
        """`replica`'s writer made these files durable, (id, bytes) each
        (Replicas.written): the disk budget counts their bytes as written. Returns the
        Orders per replica that write again the entries whose writes were lost
        (CacheManager.files_written)."""
        written = [(int(i), int(n)) for i, n in written]
        self.replicas.written([i for i, _ in written], replica)
        return self._split(self.manager.files_written(written, self._held_by(replica)), None)

    def write_lost(self, replica: int) -> dict[int, Orders]:
        """The Orders per replica that write again the entries `replica` holds whose
        writes were lost (CacheManager.write_lost): its writer resumed, another's may not
        have."""
        return self._split(self.manager.write_lost(self._held_by(replica)), None)

    def _held_by(self, replica: int):
        return lambda entry_id: replica in self.replicas.holders.get(entry_id, ())

    def check_invariants(self) -> None:
        """The manager's invariants, and the placement's (Replicas.check)."""
        self.manager.check_invariants()
        self.replicas.check(e.id for e in self.manager.index.entries())
        disk = self.manager.disk_index
        stale = set(self.replicas.writers) - set(disk.files if disk is not None else ())
        assert not stale, f"writers of files the disk index does not hold: {sorted(stale)}"
        assert self.replicas.durable <= set(self.replicas.writers), "durable files no writer owns"

    def audit(self) -> CacheAudit:
        """What the index counts and where; `violation` says which invariant fails, if any."""
        index, disk, reps = self.manager.index, self.manager.disk_index, self.replicas
        entries = {e.id: e for e in index.entries()}
        entries.update((i, index.deferred_entry(i)) for i in index.deferred)
        try:
            self.check_invariants()
            violation = ""
        except AssertionError as e:
            violation = f"{e}" or "an invariant failed"
        files = tuple(sorted(disk.files)) if disk is not None else ()
        return CacheAudit(
            ram={i: e.nbytes for i, e in entries.items()},
            holders={i: tuple(sorted(reps.holders.get(i, ()))) for i in entries},
            disk=files,
            machines={i: reps.machine_of(i) for i in files},
            unread=tuple(sorted(self.manager.unread)),
            in_flight=len(reps.flights),
            violation=violation,
        )

    def place(self, machines, home: str) -> None:
        """The machine of each replica and of the manager (the files found at start)."""
        assert len(machines) == self.replicas.count
        self.replicas.machines, self.replicas.home = list(machines), home

    def stats(self) -> CacheStats:
        def nbytes(entry_id: int) -> int | None:
            entry = self.manager.index.get(entry_id)
            return entry.nbytes if entry is not None else None

        return replace(self.manager.stats(), replicas=self.replicas.stats(nbytes))
