"""Replicas under faults, on one machine or two: the policy with fake actors that write real files.

A MachinesDriver runs requests through a ReplicatedCache and one FakeDiskActor
per replica; each machine is a cache directory of its own (two directories
stand for two machines), each actor writes in its machine's directory behind
a queue that can be paused (the real writer's order: a load reads a queued
write from that queue only, a delete drops a write not started). A plan runs
on the replica it names; a handover copies the entry from the peer it names
(read from that peer's queue or directory for a file). After every call it
checks that the manager's invariants hold, that no replica holds an entry the
manager does not place there, that every file is in its own machine's
directory, and that the directories hold exactly the disk index (writes and
deletes still queued aside).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from engine.cache import CacheManager
from engine.cache.disk_index import file_bytes
from engine.cache.messages import LostRestore, Orders, PlanRequest
from engine.cache.replicated import ReplicatedCache
from engine.config import CacheConfig
from engine.storage import file_format
from engine.storage.directory import open_cache_directory, private_directory
from tests.fakes import FakeDiskActor, entry_bytes, tokens


def seq(start: int, n: int):
    return range(start, start + n)


P1, R1, U2 = seq(1000, 300), seq(5000, 20), seq(6000, 40)


class MachinesDriver:
    def __init__(self, tmp_path, machines=("a", "b"), threshold: int = 100, **knobs) -> None:
        home = machines[0]
        config = CacheConfig(cache_dir=str(tmp_path / home), **knobs)
        self.opened = open_cache_directory(config, "fake")
        manager = CacheManager(config, fingerprint="fake", disk_index=self.opened.index)
        self.cache = ReplicatedCache(manager, len(machines), threshold)
        self.cache.place(list(machines), home)
        self.dirs = {m: private_directory(file_format.entries_dir(tmp_path / m)) for m in machines}
        self.actors = [FakeDiskActor(directory=self.dirs[m]) for m in machines]
        self.requests: dict = {}
        self.failed_loads = 0

    @property
    def manager(self) -> CacheManager:
        return self.cache.manager

    def plan(self, rid: str, prompt):
        prompt = tokens(prompt)
        plan = self.cache.plan(PlanRequest(rid, prompt))
        self.requests[rid] = (plan, prompt)
        if plan.fetch_from is not None:  # the handover, from the peer's RAM or its disk
            peer = self.actors[plan.fetch_from]
            held = peer.stored.get(plan.entry_id)
            if held is None and plan.load_from_disk:
                held = peer.read(plan.entry_id)
            if held is not None:
                self.actors[plan.replica].stored.setdefault(plan.entry_id, copy.deepcopy(held))
        self.check()
        return plan

    def commit(self, rid: str, reply=()):
        plan, prompt = self.requests.pop(rid)
        actor = self.actors[plan.replica]
        if plan.load_from_disk and not actor.serves(plan):
            self.deliver(self.cache.room(rid, plan.replica))
            if not actor.load(plan):  # the real actor asks for a new plan
                self.failed_loads += 1
                lost = LostRestore(rid, plan.entry_id, plan.length, load_failed=True)
                replanned, per_replica = self.cache.replan(lost, plan.replica)
                self.deliver(per_replica)
                plan = replanned.plan
        actor.restore(plan, prompt)
        self.cache.prefilled(rid)
        commit = actor.prefill(plan, prompt, tokens(reply))
        actor.enter(rid)
        self.deliver(self.cache.commit(commit))
        return plan

    def turn(self, rid: str, prompt, reply=()):
        self.plan(rid, prompt)
        return self.commit(rid, reply)

    def deliver(self, per_replica: dict[int, Orders]) -> None:
        for r, orders in per_replica.items():
            self.actors[r].apply(orders)
        self.report()

    def flush(self, replica: int) -> None:
        self.actors[replica].paused = False
        self.actors[replica].flush()
        self.report()

    def report(self) -> None:
        """The writers' reports: the files they made durable (the Orders that answer them,
        writes of entries whose writes were lost, go to their replicas)."""
        for r, actor in enumerate(self.actors):
            again = self.cache.files_written(actor.take_written(), r)
            if any(again.values()):
                self.deliver(again)
        self.check()

    def files(self, machine: str) -> set[int]:
        return self.actors[list(self.dirs).index(machine)].files()

    def check(self) -> None:
        self.cache.check_invariants()
        holders = self.cache.replicas.holders
        for r, actor in enumerate(self.actors):
            extra = [e for e in actor.stored if r not in holders.get(e, ())]
            assert not extra, f"replica {r} holds {extra}, which the manager does not place there"
        queued = {i.entry_id for a in self.actors for op, i in a.queue if op == "write"}
        deleting = {i for a in self.actors for op, i in a.queue if op == "delete"}
        indexed = set(self.manager.disk_index.files)
        on_disk = set()
        for machine, directory in self.dirs.items():
            found = FakeDiskActor(directory=directory).files()
            elsewhere = [i for i in found & indexed if self.cache.replicas.machine_of(i) != machine]
            assert not elsewhere, (f"indexed files of another machine in {machine}'s", elsewhere)
            on_disk |= found
        assert indexed <= on_disk | queued, ("indexed, never written", indexed - on_disk - queued)
        if not queued and not deleting:  # the writers are idle: the directories are the index
            assert on_disk == indexed, ("files nobody indexes", on_disk - indexed)


def test_an_absorbed_source_on_another_machine_is_deleted_by_its_own_writer(tmp_path):
    d = MachinesDriver(tmp_path, ("a", "b"), threshold=0)
    first = d.turn("r1", P1, R1)
    home = first.replica
    assert d.files("ab"[home]) == {first.new_entry_id}
    d.plan("busy", seq(90_000, 400))  # cold: the least loaded, the same replica
    second = d.plan("r2", tokens(P1, R1, U2))
    assert (second.replica, second.fetch_from) == (1 - home, home)
    d.commit("r2")  # absorbs the first entry on the other machine
    d.commit("busy")
    assert first.new_entry_id not in d.files("ab"[home]), "the source's file stayed behind"
    assert d.files("ab"[1 - home]) == {second.new_entry_id}


def test_an_absorbed_source_whose_write_is_queued_at_a_peer_is_never_written_after(tmp_path):
    d = MachinesDriver(tmp_path, ("a", "a"), threshold=0)
    d.actors[0].paused = True  # replica 0's writer holds its writes
    first = d.turn("r1", P1, R1)
    assert first.replica == 0 and d.files("a") == set()
    d.plan("busy", seq(90_000, 400))
    second = d.plan("r2", tokens(P1, R1, U2))
    assert (second.replica, second.fetch_from) == (1, 0)
    d.commit("r2")
    d.commit("busy")
    d.flush(0)  # what replica 0 still had queued: the source's write was dropped
    assert first.new_entry_id not in d.files("a")


def test_a_read_of_a_file_still_queued_at_another_replica_goes_to_that_writer(tmp_path):
    """A paused writer at replica 0, the plan placed on replica 1: no load failure, no
    damaged count (replica 1 fetches the entry from replica 0, whose reader sees its queue)."""
    d = MachinesDriver(tmp_path, ("a", "a"), threshold=0, ram_budget=entry_bytes(330, 3))
    d.actors[0].paused = True
    first = d.turn("r1", P1, R1)
    assert first.replica == 0
    d.turn("r2", seq(40_000, 300), seq(41_000, 20))  # evicts the first entry from RAM
    assert first.new_entry_id not in d.manager.index
    d.plan("busy", seq(90_000, 400))  # replica 0 gets busy
    again = d.plan("r3", tokens(P1, R1, U2))
    assert again.load_from_disk and again.entry_id == first.new_entry_id
    assert (again.replica, again.fetch_from) == (1, 0)
    d.commit("r3")
    d.commit("busy")
    stats = d.manager.stats()
    assert (d.failed_loads, stats.damaged_files, stats.restores_lost) == (0, 0, 0)
    d.flush(0)


def test_a_replica_lost_mid_request_commits_nothing_and_leaves_no_entry_without_a_holder(
    tmp_path,
):
    d = MachinesDriver(tmp_path, ("a", "a"))
    plan = d.plan("r1", P1)
    actor = d.actors[plan.replica]
    d.deliver(d.cache.lost(plan.replica))  # a missed ping: it is reset before it serves again
    actor.restore(plan, tokens(P1))
    commit = actor.prefill(plan, tokens(P1), tokens(R1))  # its commit arrives afterwards
    with pytest.raises(ValueError, match="no plan in flight"):
        d.cache.commit(commit)
    assert plan.new_entry_id not in d.manager.index
    assert plan.new_entry_id not in d.manager.disk_index, "a file nobody will write"
    assert not d.cache.replicas.flights
    actor.stored.clear()
    actor.staged.clear()  # the reset
    d.cache.revived(plan.replica)
    d.turn("r2", P1, R1)
    d.check()


def test_files_that_fail_to_load_leave_no_writer_behind(tmp_path):
    """Each restore whose file will not load forgets that file (damaged): the writers'
    bookkeeping forgets it too, so it holds the files indexed and no more however many
    failed over a long run."""
    d = MachinesDriver(tmp_path, ("a",), ram_budget=entry_bytes(330, 3))
    failed = []
    for k in range(4):
        system, reply, user = seq(100_000 * (k + 1), 300), seq(5000, 20), seq(6000, 40)
        first = d.turn(f"r{k}", system, reply)
        d.turn(f"other{k}", seq(100_000 * (k + 1) + 50_000, 300), reply)  # evicts it from RAM
        entry = first.new_entry_id
        assert entry not in d.manager.index and entry in d.cache.replicas.durable
        plan = d.plan(f"again{k}", tokens(system, reply, user))
        assert plan.load_from_disk and plan.entry_id == entry
        path = file_format.entry_path(d.dirs["a"], entry)
        path.write_bytes(path.read_bytes()[:100])  # damaged since: it will not load
        d.check = d.cache.check_invariants  # the directory holds an indexed file it cannot read
        again = d.commit(f"again{k}")
        del d.check
        assert again.entry_id != entry and entry not in d.manager.disk_index
        failed.append(entry)
    assert d.failed_loads == 4
    replicas = d.cache.replicas
    assert not set(failed) & (set(replicas.writers) | replicas.durable)
    assert set(replicas.writers) == set(d.manager.disk_index.files)


def _cold_commit_evicting_its_source_file(tmp_path, disk_budget: int):
    """Replica 1 stores X (its file on machine b); replica 0 stores H and a request pins
    it. A request planned from X in replica 1's RAM prefills cold (the actor found X
    gone) and commits: its new file, over the disk budget, evicts X's file (the least
    recently used not pinned). Returns the driver, X's id, and the cold commit, not sent."""
    d = MachinesDriver(tmp_path, ("a", "b"), threshold=0, disk_budget=disk_budget)
    d.plan("busy", seq(90_000, 200))  # replica 0 is busy: X goes to replica 1
    x = d.turn("x", P1, R1)
    d.commit("busy")
    plan = d.plan("y", tokens(P1, R1, U2))
    assert (plan.replica, plan.entry_id, plan.load_from_disk) == (1, x.new_entry_id, False)
    d.plan("z", tokens(seq(90_000, 200), seq(91_000, 30)))  # pins H, and uses its file last
    plan, prompt = d.requests.pop("y")
    actor = d.actors[1]
    actor.restore(plan, prompt)
    d.cache.prefilled("y")
    commit = replace(actor.prefill(plan, prompt, tokens(R1)), restored_from=None, restored_length=0)
    actor.enter("y")
    return d, x.new_entry_id, commit


def test_a_source_file_evicted_by_a_cold_commit_is_deleted_by_its_own_writer(tmp_path):
    """The cold commit forgets the writer of its source's file only after the delete of
    that file went to it: else the delete goes to the home machine's replica, and the
    file stays behind on its own machine, indexed by nobody."""
    dry, source, commit = _cold_commit_evicting_its_source_file(tmp_path / "dry", 1 << 40)
    dry.deliver(dry.cache.commit(commit))  # the sizes: the files written, the new one's estimate
    files = dry.manager.disk_index.files
    estimate = file_bytes(dry.manager.index.get(commit.entry_id))
    pinned = next(f.nbytes for i, f in files.items() if i not in (commit.entry_id, source))
    d, source, commit = _cold_commit_evicting_its_source_file(tmp_path / "run", pinned + estimate)
    assert source in d.files("b")
    per_replica = d.cache.commit(commit)
    assert source not in d.manager.disk_index and commit.entry_id in d.manager.disk_index
    assert source in per_replica[1].delete_files, "the delete went past the file's writer"
    d.deliver(per_replica)
    assert source not in d.files("b")
