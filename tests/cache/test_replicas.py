"""Several replicas behind one manager (engine.cache.replicas), with fake model actors.

A ReplicaDriver runs requests through a ReplicatedCache and one FakeModelActor
per replica: a plan runs on the replica it names, a handover copies the entry
from the peer it names, and each replica obeys the Orders addressed to it.
After every call it checks that each replica holds exactly what the manager
says it holds (what the index says, plus frees that wait for a pin).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from engine.cache import CacheManager
from engine.cache.messages import (
    CheckpointMove,
    EntryRecord,
    Orders,
    PlanRequest,
    Release,
    RestorePlan,
)
from engine.cache.replicas import Replicas
from engine.cache.replicated import ReplicatedCache
from engine.config import CacheConfig
from tests.fakes import FakeModelActor, tokens

SYSTEM = range(1000, 1300)  # a 300-token system prompt


class ReplicaDriver:
    def __init__(self, replicas: int = 2, threshold: int = 100, **knobs) -> None:
        manager = CacheManager(CacheConfig(**knobs), fingerprint="fake")
        self.cache = ReplicatedCache(manager, replicas, threshold)
        self.actors = [FakeModelActor() for _ in range(replicas)]
        self.requests: dict[str, tuple[RestorePlan, np.ndarray]] = {}
        self.namespaces: dict[str, str] = {}
        self.serial = 0

    def plan(
        self, prompt, anchor_len: int = 0, exclude=(), session: str = "", namespace: str = ""
    ) -> RestorePlan:
        self.serial += 1
        rid = f"r{self.serial}"
        prompt = tokens(prompt)
        request = PlanRequest(rid, prompt, anchor_len, namespace, tuple(exclude), session)
        plan = self.cache.plan(request)
        self.requests[rid] = (plan, prompt)
        self.namespaces[rid] = namespace
        if plan.fetch_from is not None:  # the handover: the peer's arrays, copied
            held = self.actors[plan.fetch_from].stored.get(plan.entry_id)
            if held is not None:
                self.actors[plan.replica].stored.setdefault(plan.entry_id, copy.deepcopy(held))
        self.check()
        return plan

    def commit(self, rid: str, reply=()) -> None:
        plan, prompt = self.requests.pop(rid)
        actor = self.actors[plan.replica]
        actor.restore(plan, prompt)
        self.cache.prefilled(rid)
        commit = actor.prefill(plan, prompt, tokens(reply))
        commit = dataclasses.replace(commit, namespace=self.namespaces.pop(rid, ""))
        actor.enter(rid)  # its commit's Orders come back now
        self.deliver(self.cache.commit(commit))

    def release(self, rid: str) -> None:
        self.requests.pop(rid)
        self.deliver(self.cache.release(Release(rid)))

    def turn(self, prompt, reply=(), anchor_len: int = 0) -> RestorePlan:
        plan = self.plan(prompt, anchor_len)
        self.commit(plan.request_id, reply)
        return plan

    def deliver(self, per_replica: dict[int, Orders]) -> None:
        for replica, orders in per_replica.items():
            self.actors[replica].apply(orders)
        self.check()

    def check(self) -> None:
        manager = self.cache.manager
        manager.check_invariants()
        index, holders = manager.index, self.cache.replicas.holders
        for entry in index.entries():
            assert holders.get(entry.id), f"indexed entry {entry.id} has no holder"
            for r in holders[entry.id]:
                held = self.actors[r].stored.get(entry.id)
                if held is None:  # routed here for a handover still to come
                    assert any(p.replica == r for p, _ in self.requests.values()), (entry.id, r)
                    continue
                assert held.states == set(entry.checkpoints) | {entry.length}, (entry.id, r)
        for r, actor in enumerate(self.actors):
            extra = [e for e in actor.stored if r not in holders.get(e, ())]
            assert not extra, f"replica {r} holds {extra}, which the manager does not place there"


def convo(*turns) -> np.ndarray:
    return tokens(SYSTEM, *turns)


def test_later_turns_stay_on_the_replica_holding_the_entry():
    d = ReplicaDriver()
    first = d.turn(convo(range(5000, 5100)), reply=range(7000, 7010), anchor_len=300)
    second = d.turn(convo(range(5000, 5100), range(7000, 7010), range(5200, 5300)), anchor_len=300)
    assert second.replica == first.replica and second.fetch_from is None
    assert second.kind in ("entry", "reply") and second.length >= 400


def test_a_busy_holder_sheds_to_the_least_loaded_replica_which_fetches():
    d = ReplicaDriver(threshold=100)
    first = d.turn(convo(range(5000, 5100)), reply=range(7000, 7010), anchor_len=300)
    home = first.replica
    busy = d.plan(convo(range(9000, 9500)), anchor_len=300)  # anchor affinity: the home replica
    assert busy.replica == home and d.cache.replicas.load(home) == 500
    shed = d.plan(convo(range(6000, 6050)), anchor_len=300)
    assert (shed.replica, shed.fetch_from, shed.kind) == (1 - home, home, "anchor")
    d.commit(shed.request_id)
    d.commit(busy.request_id)
    stats = d.cache.stats().replicas
    assert stats[1 - home].handovers == 1 and stats[1 - home].handover_bytes > 0
    # the anchor now lives on both replicas: each holds it, and a free reaches both
    anchor = next(e for e in d.cache.manager.index.entries() if e.role == "anchor")
    assert d.cache.replicas.holders[anchor.id] == {0, 1}


def test_a_handover_copy_released_unused_is_still_freed_on_the_replica_that_fetched_it():
    """Cancelled while pending after its fetch: the fetched copy stays in that replica's tier,
    so it stays a holder, and the anchor's free reaches it."""
    d = ReplicaDriver(threshold=100, anchor_max_entries=1)
    first = d.turn(convo(range(5000, 5100)), reply=range(7000, 7010), anchor_len=300)
    home = first.replica
    anchor = first.captures[0].entry_id
    busy = d.plan(convo(range(9000, 9500)), anchor_len=300)
    shed = d.plan(convo(range(6000, 6050)), anchor_len=300)
    assert (shed.replica, shed.fetch_from, shed.entry_id) == (1 - home, home, anchor)
    assert anchor in d.actors[1 - home].stored  # the handover stored it
    d.release(shed.request_id)  # cancelled before it ran: nothing restored
    d.commit(busy.request_id)
    d.turn(tokens(range(30_000, 30_300), range(31_000, 31_100)), anchor_len=300)  # a new anchor
    assert anchor not in d.cache.manager.index  # the cap of one anchor evicted it
    assert all(anchor not in actor.stored for actor in d.actors), "the copy leaked"


def test_within_the_threshold_affinity_wins():
    d = ReplicaDriver(threshold=1000)
    first = d.turn(convo(range(5000, 5100)), anchor_len=300)
    d.plan(convo(range(9000, 9500)), anchor_len=300)
    near = d.plan(convo(range(6000, 6050)), anchor_len=300)
    assert near.replica == first.replica and near.fetch_from is None


def test_cold_sessions_spread_by_queued_prefill_tokens():
    d = ReplicaDriver(replicas=3)
    placed = [d.plan(tokens(range(i * 1000, i * 1000 + 200 + i))).replica for i in range(3)]
    assert sorted(placed) == [0, 1, 2]
    assert [d.cache.replicas.load(r) for r in range(3)] == [200, 201, 202]
    d.cache.prefilled("r1")
    assert d.cache.replicas.load(0) == 0
    assert d.plan(tokens(range(50000, 50100))).replica == 0


def test_absorption_frees_the_source_on_every_holder():
    d = ReplicaDriver(threshold=0)
    p1 = convo(range(5000, 5100))
    first = d.turn(p1, reply=range(7000, 7010), anchor_len=300)
    busy = d.plan(tokens(range(90000, 90400)))  # cold: the least loaded is the home replica
    assert busy.replica == first.replica
    p2 = tokens(p1, range(7000, 7010), range(5200, 5300))
    moved = d.plan(p2, anchor_len=300)
    assert (moved.replica, moved.fetch_from) == (1 - first.replica, first.replica)
    d.commit(moved.request_id)
    assert first.new_entry_id not in d.cache.manager.index  # absorbed
    for actor in d.actors:
        assert first.new_entry_id not in actor.stored
    d.release(busy.request_id)


def test_a_lost_replica_takes_its_entries_out_of_the_index():
    d = ReplicaDriver()
    first = d.turn(convo(range(5000, 5100)), reply=range(7000, 7010), anchor_len=300)
    home = first.replica
    d.actors[home].stored.clear()  # what a restarted replica holds
    d.deliver(d.cache.lost(home))
    assert not d.cache.manager.index.entries()
    again = d.plan(convo(range(5000, 5100), range(7000, 7010), range(5200, 5300)), anchor_len=300)
    assert again.replica == 1 - home and again.kind == "none"
    with pytest.raises(LookupError):
        d.cache.plan(PlanRequest("x", tokens(range(10)), 0, "", (1 - home,)))
    d.cache.revived(home)
    assert sorted(d.cache.replicas.alive()) == [0, 1]


def test_retry_excludes_the_dead_replica():
    d = ReplicaDriver()
    plan = d.plan(tokens(range(300)))
    d.release(plan.request_id)
    again = d.plan(tokens(range(300)), exclude=(plan.replica,))
    assert again.replica == 1 - plan.replica


def test_split_sends_frees_to_holders_a_write_to_one_and_its_delete_to_that_writer():
    reps = Replicas(3)
    reps.holders = {7: {0, 2}, 8: {1}}
    record = EntryRecord(7, "", "conversation", tokens(range(4)), 4, (), 1, 1)
    per = reps.split(
        Orders(
            moves=(CheckpointMove(7, 2, 8),),
            drop_checkpoints=((7, 2),),
            free=(7,),
            write=(7,),
            records=(record,),
        ),
        caller=2,
    )
    assert per[2].write == (7,) and per[0].write == ()
    assert per[0].free == per[2].free == (7,)
    assert per[1].moves == (CheckpointMove(7, 2, 8),)
    assert reps.writers == {7: 2} and 7 not in reps.holders
    assert reps.split(Orders(delete_files=(7,)), caller=0)[2].delete_files == (7,)
    reps.machines = ["a", "b", "b"]
    reps.lost(2)
    reps.writers[9] = 2  # its writer died: a replica of the same machine deletes the file
    assert reps.split(Orders(delete_files=(9,)), caller=0)[1].delete_files == (9,)


def test_a_file_on_another_machine_is_fetched_from_a_replica_there():
    reps = Replicas(3, threshold=100)
    reps.machines, reps.home = ["a", "b", "b"], "a"
    reps.writers[7] = 2  # written on machine b
    reps.written([7], replica=2)  # and durable there: any replica of b reads it

    def disk_plan(rid: str, entry_id: int = 7) -> RestorePlan:
        return RestorePlan(rid, entry_id, 400, "entry", new_entry_id=None, load_from_disk=True)

    local = reps.route("r1", disk_plan("r1"), 500)
    assert (local.replica, local.fetch_from) == (1, None)  # b's least loaded reads it
    reps.replicas[1].load = reps.replicas[2].load = 1000
    shed = reps.route("r2", disk_plan("r2"), 500)
    assert (shed.replica, shed.fetch_from) == (0, 1)  # a fetches it from a replica on b
    found_at_start = reps.route("r3", disk_plan("r3", entry_id=9), 500)
    assert (found_at_start.replica, found_at_start.fetch_from) == (0, None)  # home: a


@pytest.mark.parametrize("count,threshold", [(0, 10), (2, -1)])
def test_bad_settings_are_value_errors(count, threshold):
    with pytest.raises(ValueError):
        Replicas(count, threshold)


def test_a_lost_restore_is_replanned_on_the_replica_that_lost_it():
    """The replica reports the gone source; the request stays there, with numbered Orders."""
    from engine.cache.messages import LostRestore

    d = ReplicaDriver()
    first = d.turn(convo(range(5000, 5100)), reply=range(7000, 7010), anchor_len=300)
    home, entry = first.replica, first.new_entry_id
    second = d.plan(convo(range(5000, 5100), range(7000, 7010), range(5200, 5300)), anchor_len=300)
    assert (second.replica, second.entry_id) == (home, entry)
    del d.actors[home].stored[entry]  # the replica does not hold it after all
    lost = LostRestore(second.request_id, entry, second.length)
    replanned, per_replica = d.cache.replan(lost, home)
    assert replanned.plan.replica == home and replanned.plan.entry_id != entry
    assert per_replica[home].seq == replanned.plan.after_orders > second.after_orders
    d.requests[second.request_id] = (replanned.plan, d.requests[second.request_id][1])
    d.deliver(per_replica)
    d.commit(second.request_id)
    assert d.cache.stats().restores_lost == 1


def test_a_wait_for_a_flight_names_its_replica_which_holds_the_early_prompt_end():
    """The front end asks the flight's replica to store its prompt end early: the answer
    names that replica, and the manager places the early entry there."""
    from engine.cache.messages import PromptEndCommit
    from tests.fakes.model_actor import KVPT, STATE

    d = ReplicaDriver()
    d.plan(range(20_000, 20_200))  # replica loads differ: the flight may go either way
    flight = d.plan(range(1000, 3000))
    extended = tokens(range(1000, 3000), range(9000, 9300))
    waiting = d.cache.plan(PlanRequest("w", extended, may_wait=True))
    early = waiting.after_entry
    assert (waiting.after, waiting.replica) == (flight.request_id, flight.replica)
    assert early is not None and d.cache.replicas.holders[early] == {flight.replica}
    prompt = tokens(range(1000, 3000))
    d.actors[flight.replica].store_capture(early, prompt, 2000, "early")
    d.actors[flight.replica].enter("early")
    commit = PromptEndCommit(flight.request_id, "", early, prompt, KVPT, STATE)
    d.deliver(d.cache.commit_anchor(commit))
    planned = d.cache.plan(PlanRequest("w", extended, may_wait=True))
    assert (planned.after, planned.entry_id, planned.length) == ("", early, 2000)


def test_an_early_prompt_end_stored_after_its_flight_was_released_is_freed_on_its_replica():
    from engine.cache.messages import PromptEndCommit
    from tests.fakes.model_actor import KVPT, STATE

    d = ReplicaDriver()
    flight = d.plan(range(1000, 3000))
    extended = tokens(range(1000, 3000), range(9000, 9300))
    early = d.cache.plan(PlanRequest("w", extended, may_wait=True)).after_entry
    d.release(flight.request_id)  # its release overtakes the early store
    actor = d.actors[flight.replica]
    actor.store_capture(early, tokens(range(1000, 3000)), 2000, "early")
    actor.enter("early")
    commit = PromptEndCommit(flight.request_id, "", early, tokens(range(1000, 3000)), KVPT, STATE)
    d.deliver(d.cache.commit_anchor(commit, flight.replica))
    assert early not in actor.stored and d.cache.manager.index.get(early) is None
