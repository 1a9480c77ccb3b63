"""No phantom entries: every entry the index keeps is one the model actor holds or will load.

The three paths that used to leave an indexed entry the actor had dropped
(every later restore from it cold, and LRU never clearing it), each driven
through fakes.DiskDriver, plus what happens when a restore is found gone
anyway: a LostRestore, a new plan, a counter.
"""

from __future__ import annotations

from engine.cache.messages import LostRestore
from tests.fakes import KVPT, STATE, DiskDriver, Driver, tokens


def seq(start: int, n: int) -> range:
    return range(start, start + n)


A, B, REPLY = seq(100_000, 600), seq(200_000, 600), seq(5000, 20)
ONE = 620 * KVPT + 3 * STATE  # a conversation of 600 + 20 tokens: its state, guard and reply


def test_an_entry_evicted_at_a_plan_and_read_back_from_its_file_is_not_freed_after(tmp_path):
    """A plan's eviction waits for the next Orders; a plan re-reading that entry takes it back."""
    d = DiskDriver(tmp_path, ram_budget=ONE + 10)  # RAM holds one conversation
    a = d.turn(A, REPLY)[0].new_entry_id
    b = d.turn(B, REPLY)[0].new_entry_id  # evicts a from RAM; its file stays
    first = d.plan(tokens(A, REPLY, seq(7000, 10)))
    assert (first.entry_id, first.load_from_disk) == (a, True)
    assert d.manager.pending_orders.free == (b,), "b is evicted for a's load"
    second = d.plan(tokens(B, REPLY, seq(7100, 10)))
    assert (second.entry_id, second.load_from_disk) == (b, True)
    assert b not in d.manager.pending_orders.free, "the free of b is taken back"
    assert d.restore(second.request_id)  # the actor still holds b: it reads no file
    orders = d.commit(first.request_id, seq(8, 5))
    assert b not in orders.free
    d.commit(second.request_id, seq(9, 5))  # absorbs b: the actor must still hold it
    third = d.plan(tokens(B, REPLY, seq(7100, 10), seq(9, 5), seq(7200, 10)))
    assert third.kind != "none" and not third.load_from_disk
    d.commit(third.request_id)
    assert d.manager.stats().restores_lost == 0


def test_a_plan_names_the_orders_before_it_and_the_actor_waits_for_them():
    """A commit's Orders and a later plan travel by different paths: the plan says which
    Orders it needs, and the actor restores only after them."""
    d = Driver()
    first = d.plan(tokens(A))
    assert first.after_orders == 0
    d.hold = True  # the commit's Orders are slow to arrive
    orders = d.commit(first.request_id, REPLY)
    assert orders.seq == 1 and d.in_transit == [orders]
    d.hold = False
    second = d.plan(tokens(A, REPLY, seq(7000, 10)))
    assert second.after_orders == 1
    assert not d.restore(second.request_id), "restored before the Orders it depends on"
    d.deliver()
    assert d.restore(second.request_id)
    assert d.commit(second.request_id).seq == 2


def test_a_waiting_plan_indexes_nothing_from_the_disk(tmp_path):
    """A plan made to wait on an anchor in capture restores that anchor: the file its first
    lookup found stays on disk, never an indexed entry nobody loads."""
    system = seq(1000, 500)
    d = DiskDriver(tmp_path, ram_budget=2 * ONE)
    capturer = d.plan(tokens(system, seq(7000, 100)), anchor_len=500)
    assert [c.kind for c in capturer.captures][:1] == ["anchor"]
    short = d.turn(seq(1000, 100), seq(1100, 20))[0].new_entry_id  # a prefix of the system
    for k in range(3):  # push it out of RAM: on disk only
        d.turn(seq(300_000 + 1000 * k, 600), REPLY)
    assert short not in d.manager.index and short in d.manager.disk_index
    waiting = d.plan(tokens(system, seq(7500, 100)), anchor_len=500)
    assert waiting.wait and waiting.kind == "anchor" and not waiting.load_from_disk
    assert short not in d.manager.index, "the disk entry the lookup found was not kept"
    d.capture_anchor(capturer.request_id)
    d.commit(waiting.request_id, seq(8, 5))
    d.commit(capturer.request_id, seq(9, 5))


def test_a_lost_restore_is_replanned_from_its_file_and_counted(tmp_path):
    d = DiskDriver(tmp_path)
    a = d.turn(A, REPLY)[0].new_entry_id
    plan = d.plan(tokens(A, REPLY, seq(7000, 10)))
    assert (plan.entry_id, plan.load_from_disk) == (a, False)
    del d.actor.stored[a]  # the actor does not hold it after all
    new = d.lose(plan.request_id)
    assert (new.entry_id, new.length, new.load_from_disk) == (a, 620, True)
    assert new.new_entry_id != plan.new_entry_id and new.after_orders > plan.after_orders
    d.commit(plan.request_id, seq(8, 5))
    stats = d.manager.stats()
    assert (stats.restores_lost, stats.damaged_files) == (1, 0)
    assert stats.hits == {"entry": 2 - 1, "none": 1}, "the request counts once, by its new plan"


def test_a_restore_whose_file_fails_is_replanned_without_it(tmp_path):
    d = DiskDriver(tmp_path, ram_budget=ONE + 10)
    a = d.turn(A, REPLY)[0].new_entry_id
    d.turn(B, REPLY)  # a is on disk only
    plan = d.plan(tokens(A, REPLY, seq(7000, 10)))
    assert (plan.entry_id, plan.load_from_disk) == (a, True)
    (tmp_path / "entries" / f"{a}.entry").write_bytes(b"damaged")
    new = d.lose(plan.request_id, load_failed=True)
    assert (new.entry_id, new.kind) == (None, "none")
    assert a not in d.manager.disk_index
    d.commit(plan.request_id)
    stats = d.manager.stats()
    assert (stats.restores_lost, stats.damaged_files) == (1, 1)


def test_a_lost_restore_of_a_request_not_in_flight_answers_no_plan():
    d = Driver()
    replanned = d.manager.replan(LostRestore("gone", 1, 10))
    assert replanned.plan is None and not replanned.orders
