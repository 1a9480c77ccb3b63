"""The cache-manager actor: a thin Ray shell over engine.cache's CacheManager and Replicas.

One actor serializes every cache decision, so the policy needs no locks. It
holds no tensors: token arrays, lengths, kinds, sizes and ids. At start it
opens the cache directory (engine.storage.directory: lock, header scan) and
hands the disk index it built to the policy. With several model replicas
(engine.cache.replicated.ReplicatedCache) it places each plan on a replica and
answers a replica's call with that replica's Orders; the Orders for other
replicas (frees of entries they hold too) it sends them itself, without
waiting.

Supervision: Ray restarts the actor when its process dies (it rescans the
directory then). Until `resync(epoch, first_id)` it plans nothing
(`NotSynchronised`): a new incarnation allocates ids from 1 and indexes none
of what the replicas still hold, so a plan made before the replicas are reset
could reuse an id a replica holds, or restore another prompt's rows. `resync`
rebuilds the manager from a fresh scan of the directory, allocating ids from
`first_id` on, so no id a model replica still holds or writes is given out
twice; `hello` reports the incarnation and the epoch of the last resync.

Each replica has an epoch of its own (the last one it was reset in: the
whole engine's at `resync`, its own at `revived`), and every plan carries
the epoch of the replica it is placed on (`RestorePlan.epoch`): a replica
refuses a plan of another epoch, so nothing planned before its reset runs
after it. A model replica that was reset (restarted by Ray, or lost and
answering again) took its writer's queue with it or flushed it: at `revived`
(`reconcile`), the files it was to write and did not leave the disk index
(as do the writes a live replica reports lost, `files_lost`), and the files it
was to delete and did not leave the directory, so the index stays true to
the directory. Its writer reports the files it made durable (`files_written`):
until then only it reads them (engine.cache.replicas).

Its process gives glibc's free pages back every `trim_s` seconds (the serve's
`malloc_trim_s`; engine.runtime.malloc.Trimmer, as the front end does): its plans and commits
allocate and free token arrays and records all day, and what they freed
otherwise stays held in malloc's arenas. What made a soak's cache manager grow
was live memory, not freed pages: a one-off ~2 MiB step when the interpreter's
interned-string table resized, churned by a `Path` per file on every `stats`
read (engine.storage.file_format.file_id; docs/benchmarks.md, "Soak").
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from dataclasses import replace

import ray

from engine.actors.hello import Hello
from engine.actors.names import log_to_stderr
from engine.cache.manager import CacheManager
from engine.cache.messages import (
    AnchorCommit,
    AnchorUse,
    CacheAudit,
    CacheStats,
    Commit,
    LostRestore,
    Orders,
    PlanRequest,
    Release,
    Replanned,
    RestorePlan,
)
from engine.cache.replicas import DEFAULT_THRESHOLD
from engine.cache.replicated import ReplicatedCache
from engine.cache.tree import CacheTree
from engine.config import CacheConfig
from engine.runtime.malloc import Trimmer
from engine.storage.directory import open_cache_directory

log = logging.getLogger(__name__)


class NotSynchronised(RuntimeError):
    """The cache manager (re)started and the replicas are not synchronised with it yet: it
    plans nothing until `resync`. The front end waits for the next epoch and asks again."""


@ray.remote(num_cpus=0)
class CacheManagerActor:
    def __init__(
        self,
        config: CacheConfig,
        fingerprint: str,
        has_state_layers: bool,
        replicas: int = 1,
        threshold: int = DEFAULT_THRESHOLD,
        trim_s: float = 30.0,
    ):
        log_to_stderr()
        self.config = config
        self.fingerprint = fingerprint
        self.has_state_layers = has_state_layers
        self.replicas = replicas
        self.threshold = threshold
        self.incarnation = uuid.uuid4().hex
        self.epoch = -1  # no plan before the first resync
        self.epochs = [-1] * replicas  # each replica's epoch: the plans placed there carry it
        self.placed: tuple[list[str], str] | None = None  # the replicas' machines, and ours
        self.directory = open_cache_directory(config, fingerprint)
        self.cache = self._build(first_id=1)
        log.info(
            "cache manager started: mode %s, %s",
            config.mode,
            f"cache directory {config.resolved_cache_dir}" if self.directory else "no disk tier",
        )
        self.replica_handles: list = []  # the replicas' handles, for Orders they did not ask for
        self.trimmer = Trimmer(trim_s)
        self.trimmer.start()

    def _build(self, first_id: int) -> ReplicatedCache:
        manager = CacheManager(
            self.config,
            fingerprint=self.fingerprint,
            has_state_layers=self.has_state_layers,
            disk_index=self.directory.index if self.directory else None,
            first_id=first_id,
        )
        return ReplicatedCache(manager, self.replicas, self.threshold)

    def malloc_trims(self) -> tuple[int, int]:
        """(trims, resident bytes they gave back) of this process so far."""
        return self.trimmer.trims, self.trimmer.returned

    def hello(self, loop_deadline: float = 0.0) -> Hello:
        return Hello(self.incarnation, self.epoch, os.getpid())

    def resync(self, epoch: int, first_id: int, rescan: bool = True, lost=()) -> None:
        """Forget every plan and RAM entry; index the directory as it is now; plan in `epoch`
        from now on. `lost`: the replicas that were not reset with the others (nothing is
        placed on them until they are revived)."""
        if self.directory is not None and rescan:
            c = self.config
            self.directory.rescan(
                self.fingerprint, c.disk_budget, (c.anchor_max_entries, c.anchor_max_bytes)
            )
        self.cache = self._build(first_id)
        if self.placed is not None:
            self.cache.place(*self.placed)
        self.epoch = epoch
        self.epochs = [epoch] * self.replicas
        for replica in lost:  # nothing in flight, nothing indexed yet: no Orders to hand out
            self.cache.replicas.lost(replica)

    @property
    def manager(self) -> CacheManager:
        return self.cache.manager

    def attach(self, replicas, machines=None) -> None:
        """The replicas' handles and machines (IP addresses; None keeps those known, at
        first all on this one)."""
        self.replica_handles = list(replicas)
        home = ray.util.get_node_ip_address()
        if machines is not None or self.placed is None:
            self.placed = (list(machines or [home] * len(self.replica_handles)), home)
            self.cache.place(*self.placed)

    def _deliver(self, per_replica: dict[int, Orders], caller: int | None) -> Orders:
        """The caller's Orders; the others' are sent to their replicas now."""
        own = per_replica.pop(caller, Orders()) if caller is not None else Orders()
        for replica, orders in per_replica.items():
            if orders and replica < len(self.replica_handles):
                self.replica_handles[replica].apply_orders.remote(orders)
        return own

    def plan(self, req: PlanRequest) -> RestorePlan:
        """The request's plan, placed on a replica and stamped with that replica's epoch.
        NotSynchronised before the first resync of this incarnation."""
        if self.epoch < 0:
            raise NotSynchronised("the cache manager restarted; the replicas are resyncing")
        return self._stamped(self.cache.plan(req))

    def _stamped(self, plan: RestorePlan) -> RestorePlan:
        return replace(plan, epoch=self.epochs[plan.replica])

    def prefilled(self, request_id: str) -> None:
        """The request's prefill ended (or it ended): its tokens leave its replica's queue."""
        self.cache.prefilled(request_id)

    def commit(self, commit: Commit, replica: int = 0) -> Orders:
        return self._deliver(self.cache.commit(commit), replica)

    def commit_anchor(self, anchor: AnchorCommit, replica: int = 0) -> Orders:
        return self._deliver(self.cache.commit_anchor(anchor, replica), replica)

    def room(self, request_id: str, replica: int = 0) -> Orders:
        return self._deliver(self.cache.room(request_id, replica), replica)

    def release(self, release: Release, replica: int | None = 0) -> Orders:
        return self._deliver(self.cache.release(release), replica)

    def lost(self, replica: int) -> None:
        """A replica died: forget what it held (its files stay indexed)."""
        log.warning("replica %d lost: its RAM entries leave the index", replica)
        self._deliver(self.cache.lost(replica), None)

    def revived(
        self,
        replica: int,
        restarted: bool = False,
        epoch: int | None = None,
        machine: str | None = None,
    ) -> None:
        """Route to `replica` again, reset in `epoch` (plans placed there carry it), on
        `machine` if it moved. `restarted`: it was reset, and its writer's queue is gone
        (a dead process) or flushed: the directory and the disk index are reconciled."""
        if restarted:
            reconcile(self.directory, self.cache, replica)
        self.cache.revived(replica, machine)
        if machine and self.placed is not None:
            self.placed[0][replica] = machine
        if epoch is not None:
            self.epochs[replica] = epoch

    def files_lost(self, entry_ids: list[int], replica: int = 0, why: str = "") -> None:
        """Writes of a replica that never reached the disk (its queue or the disk was full,
        or it died): their files leave the disk index."""
        forgotten = self.cache.files_lost(entry_ids)
        if forgotten:
            why = why or "its writer's queue or the disk was full"
            log.warning(
                "replica %d lost %d file writes (%s): %s", replica, len(forgotten), why, forgotten
            )

    def files_written(self, written: list[tuple[int, int]], replica: int = 0) -> None:
        """Files `replica`'s writer made durable, (id, bytes) each: any replica of its
        machine may read them, and the disk budget counts their bytes; the entries whose
        writes were lost are ordered written again at their holders."""
        self._deliver(self.cache.files_written(written, replica), None)

    def disk_resumed(self, replica: int = 0) -> None:
        """`replica`'s writer resumed after a full disk: the entries whose writes were lost
        are ordered written again at their holders."""
        self._deliver(self.cache.write_lost(replica), None)

    def alive(self) -> list[int]:
        return self.cache.replicas.alive()

    def replan(self, lost: LostRestore, replica: int = 0) -> Replanned:
        replanned, per_replica = self.cache.replan(lost, replica)
        plan = replanned.plan and self._stamped(replanned.plan)
        return Replanned(plan, self._deliver(per_replica, replica))

    def audit(self) -> CacheAudit:
        """What the index counts and where, and whether the invariants hold (read-only)."""
        return self.cache.audit()

    @ray.method(max_task_retries=3)
    def stats(self) -> CacheStats:
        stats = self.cache.stats()
        if self.directory is None:
            return stats
        return dataclasses.replace(
            stats, disk_file_bytes=self.directory.nbytes(), disk_free_bytes=self.directory.free()
        )

    def anchors(self) -> list[AnchorUse]:
        return self.manager.anchors()

    def tree(self, namespace: str | None = None) -> CacheTree:
        return self.manager.tree(namespace)


def reconcile(directory, cache: ReplicatedCache, replica: int) -> tuple[list[int], list[int]]:
    """After replica `replica` restarted: the files its writer never wrote leave the disk
    index, and the files the index no longer holds (deletes that writer never did) leave
    the directory. Only for a replica of this machine (others write their own
    directories). The budget counts the files there at their bytes on disk. Returns
    (forgotten, deleted)."""
    replicas = cache.replicas
    if directory is None or replicas.machines[replica] != replicas.home:
        return [], []
    unwritten, orphans = cache.restarted(replica, directory.entry_ids())
    forgotten = cache.files_lost(unwritten)
    freed = directory.delete(orphans)
    # Files it wrote whose report died with it count at their bytes, as reported ones do.
    cache.manager.file_sizes(directory.sizes().items())
    if forgotten or orphans:
        log.warning(
            "replica %d restarted: %d file writes lost %s, %d files deleted (%.1f MB) that its "
            "writer was to delete %s",
            replica,
            len(forgotten),
            forgotten,
            len(orphans),
            freed / 1e6,
            orphans,
        )
    return forgotten, orphans
