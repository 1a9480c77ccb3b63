"""Budgets, anchors' caps, namespaces, exact and off modes, in-flight pinning, bad input.

Exact eviction orders asserted; sizes come from the fake hybrid layout
(fakes.KVPT bytes per token, fakes.STATE bytes per state snapshot).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cache import CacheManager
from engine.cache.messages import (
    CapturedPoint,
    CheckpointMove,
    Commit,
    Orders,
    PlanRequest,
    Release,
)
from engine.config import CacheConfig
from tests.fakes import KVPT, STATE, DiskDriver, Driver, entry_bytes, tokens


def seq(start: int, n: int) -> range:
    return range(start, start + n)


CONVERSATION = entry_bytes(220, 1)  # a 200-token prompt (no guard) plus a 20-token reply


def conversation(d: Driver, k: int, namespace: str = ""):
    """A fresh single-turn conversation k: 200 prompt tokens, 20 reply tokens."""
    return d.turn(seq(100_000 * k, 200), seq(100_000 * k + 50_000, 20), namespace=namespace)


# -- the RAM budget --------------------------------------------------------------


def test_ram_budget_evicts_least_recently_used_conversations_first():
    d = Driver(ram_budget=3 * CONVERSATION)
    for k in (1, 2, 3):
        assert conversation(d, k)[1] == Orders()
    assert conversation(d, 4)[1] == Orders(free=(1,))
    # a lookup touches entry 2 (restores at its prompt end), then is cancelled
    plan = d.plan(tokens(seq(200_000, 200), seq(7, 10)))
    assert (plan.entry_id, plan.kind) == (2, "reply")
    assert d.release(plan.request_id) == Orders(free=(plan.new_entry_id,))
    assert conversation(d, 5)[1] == Orders(free=(3,))
    assert conversation(d, 6)[1] == Orders(free=(4,))
    stats = d.manager.stats()
    assert (stats.entries, stats.evictions, stats.ram_bytes) == (3, 3, 3 * CONVERSATION)


def test_an_entry_larger_than_the_budget_is_evicted_at_once():
    d = Driver(ram_budget=CONVERSATION - 1)
    assert conversation(d, 1)[1] == Orders(free=(1,))
    assert d.manager.stats().entries == 0


def test_anchors_outlive_conversations_until_they_alone_overflow():
    anchor = entry_bytes(150)
    d = Driver(ram_budget=2 * anchor + CONVERSATION)
    first = tokens(seq(100_000, 150), seq(150_000, 50))
    second = tokens(seq(200_000, 150), seq(250_000, 50))
    d.turn(first, seq(7, 20), anchor_len=150)  # entry 1, anchor 2
    d.turn(second, seq(7, 20), anchor_len=150)  # entry 3, anchor 4
    assert d.manager.stats().evictions == 1  # entry 1, older than anchor 2, goes first
    assert d.entry(1) is None and d.entry(2) and d.entry(4)
    small = Driver(ram_budget=anchor)
    _, orders = small.turn(first, seq(7, 20), anchor_len=150)
    assert orders == Orders(free=(1,))
    _, orders = small.turn(second, seq(7, 20), anchor_len=150)
    assert orders == Orders(free=(3, 2))  # the conversation, then the older anchor


# -- the anchors' own caps ----------------------------------------------------------


def anchored(d: Driver, k: int, user: int = 0, anchor_len: int = 300, namespace: str = ""):
    """A session whose first `anchor_len` tokens are system prompt k, then user message `user`."""
    prompt = tokens(seq(100_000 * k, anchor_len), seq(100_000 * k + 60_000 + 1000 * user, 20))
    return d.turn(prompt, seq(7, 10), anchor_len=anchor_len, namespace=namespace)


@pytest.mark.parametrize(
    "knobs",
    [dict(anchor_max_entries=2), dict(anchor_max_bytes=2 * entry_bytes(300))],
    ids=["by count", "by bytes"],
)
def test_anchor_caps_evict_the_least_recently_used_anchor(knobs):
    d = Driver(**knobs)
    anchored(d, 1)  # entry 1, anchor 2
    anchored(d, 2)  # entry 3, anchor 4
    plan, _ = anchored(d, 1, user=1)  # a new session on system prompt 1 touches anchor 2: entry 5
    assert (plan.entry_id, plan.kind) == (2, "anchor")
    _, orders = anchored(d, 3)  # entry 6, anchor 7
    assert orders == Orders(free=(4,), rejoin=(3,))  # entry 3 read its first rows from 4
    assert sorted(a.id for a in d.manager.index.entries("anchor")) == [2, 7]


def test_a_timestamp_in_the_system_prompt_never_grows_anchors_past_their_caps():
    d = Driver(anchor_max_entries=4, anchor_max_bytes=4 * entry_bytes(598))
    kinds = []
    for minute in range(12):
        system = tokens(seq(10_000, 590), [minute], seq(10_591, 9))  # a timestamp at 590
        plan, _ = d.turn(tokens(system, seq(20_000 + minute * 100, 20)), seq(7, 10), anchor_len=598)
        kinds.append(plan.kind)
        stats = d.manager.stats()
        assert stats.anchors <= 4 and stats.anchor_bytes <= 4 * entry_bytes(598)
    # the second prompt places a divergence point at the timestamp; every later one lands on it
    assert kinds == ["none", "none"] + ["divergence"] * 10
    assert d.manager.stats().anchors == 4


# -- namespaces ----------------------------------------------------------------------


def test_namespaces_never_share_entries_or_anchors():
    d = Driver()
    anchored(d, 1, namespace="a")
    plan, _ = anchored(d, 1, namespace="b")
    assert plan.kind == "none" and [c.kind for c in plan.captures] == ["anchor", "guard"]
    plan, _ = anchored(d, 1, user=1, namespace="a")
    assert (plan.entry_id, plan.kind) == (2, "anchor")
    assert d.manager.stats().anchors == 2


# -- exact mode ------------------------------------------------------------------------


def test_exact_mode_stores_two_whole_snapshots_and_matches_exact_prefixes():
    d = Driver(mode="exact", exact_max_entries=3)
    p1 = tokens(seq(1000, 600))
    plan, orders = d.turn(p1, seq(5000, 20), anchor_len=500)
    assert (plan.kind, plan.new_entry_id, plan.store_reply) == ("none", 1, False)
    assert [(c.length, c.kind, c.entry_id) for c in plan.captures] == [(584, "snapshot", 2)]
    assert orders == Orders() and [e.length for e in d.manager.index.entries()] == [584, 600]
    p2 = tokens(p1, seq(5000, 20), seq(7000, 10))
    plan, orders = d.turn(p2, seq(8000, 20))
    assert (plan.entry_id, plan.length, plan.kind) == (1, 600, "entry")  # the reply is not cached
    assert orders == Orders(free=(2,))  # four snapshots over a cap of three: LRU first
    plan, orders = d.turn(p2, seq(9000, 20))  # a verbatim resend restores at prompt minus 16
    assert (plan.entry_id, plan.length, plan.captures) == (4, 614, ())
    assert orders == Orders(free=(5,))  # the full prompt is already stored
    stats = d.manager.stats()
    assert (stats.entries, stats.anchors, stats.checkpoints, stats.evictions) == (3, 0, {}, 1)


def test_exact_mode_keeps_a_prefill_cancelled_past_its_snapshot():
    d = Driver(mode="exact")
    plan = d.plan(seq(1000, 600))
    assert d.commit(plan.request_id, upto=590) == Orders()
    assert [e.length for e in d.manager.index.entries()] == [584, 590]
    plan = d.plan(seq(1000, 600))
    assert (plan.entry_id, plan.length) == (1, 590)


# -- off mode -------------------------------------------------------------------------------


def test_off_mode_plans_cold_and_stores_nothing():
    d = Driver(mode="off")
    for _ in range(2):
        plan, orders = d.turn(seq(1000, 600), seq(5000, 20), anchor_len=500)
        assert (plan.entry_id, plan.length, plan.kind) == (None, 0, "none")
        assert (plan.captures, plan.new_entry_id) == ((), None)
        assert orders == Orders()
    plan = d.plan(seq(1000, 600))
    assert d.release(plan.request_id) == Orders()
    assert d.actor.stored == {}
    stats = d.manager.stats()
    assert (stats.mode, stats.entries, stats.hits, stats.prompt_tokens) == ("off", 0, {}, 0)


# -- in-flight pinning -------------------------------------------------------------------------


def test_eviction_of_a_pinned_entry_defers_its_free():
    d = Driver(ram_budget=2 * CONVERSATION + 15 * KVPT)  # room for the pinned one's longer entry
    conversation(d, 1)
    conversation(d, 2)
    pending = d.plan(tokens(seq(100_000, 200), seq(150_000, 20), seq(7, 10)))  # pins entry 1
    assert (pending.entry_id, pending.length) == (1, 220)
    assert conversation(d, 3)[1] == Orders(free=(2,))
    # Entry 1 leaves the index, its free waits for the pin; it still holds RAM, so the
    # budget counts it and entry 4 goes as well.
    assert conversation(d, 4)[1] == Orders(free=(4,))
    assert d.entry(1) is None and d.manager.index.deferred == (1,)
    held = sum(e.nbytes for e in d.manager.index.entries()) + d.manager.index.deferred_bytes
    assert held <= d.manager.config.ram_budget
    d.restore(pending.request_id)  # the actor still holds it
    # the deferred free, and no eviction: the new entry fits beside what is left
    assert d.commit(pending.request_id, seq(8, 5)) == Orders(free=(1,))


def test_absorption_while_another_request_reads_the_source():
    d = Driver()
    d.turn(seq(1000, 600), seq(5000, 20))
    rerendered = d.plan(tokens(seq(1000, 600), seq(6000, 20), seq(7000, 10)))  # at 600
    verbatim = d.plan(tokens(seq(1000, 600), seq(5000, 20), seq(7000, 10)))  # pins the full 620
    assert (rerendered.length, verbatim.length) == (600, 620)
    moved = (CheckpointMove(1, 584, 2), CheckpointMove(1, 600, 2))
    assert d.commit(rerendered.request_id, seq(8, 5)) == Orders(moves=moved)  # free deferred
    assert d.commit(verbatim.request_id, seq(9, 5)) == Orders(free=(1,))


def test_absorption_with_a_pinned_source_moves_its_points_and_frees_it_after_the_pin():
    d = Driver()
    d.turn(seq(1000, 600), seq(5000, 20))
    first = d.plan(tokens(seq(1000, 600), seq(5000, 20), seq(7000, 10)))
    second = d.plan(tokens(seq(1000, 600), seq(5000, 20), seq(7100, 10)))
    moved = tuple(CheckpointMove(1, n, 2) for n in (584, 600, 620))
    # The second request still pins entry 1 at 620: a move copies, the free waits.
    assert d.commit(first.request_id, seq(8, 5)) == Orders(moves=moved)
    assert d.checkpoints(2) == {584: "guard", 600: "final", 620: "final", 630: "reply"}
    assert 1 not in d.manager.index and d.manager.index.deferred == (1,)
    assert d.commit(second.request_id, seq(9, 5)) == Orders(free=(1,))
    assert d.manager.stats().entries == 2  # the two siblings, entry 1 absorbed into the first


def test_a_cold_fallback_commit_forgets_its_source_and_counts_it():
    d = Driver()
    d.turn(seq(1000, 600), seq(5000, 20))
    plan = d.plan(tokens(seq(1000, 600), seq(5000, 20), seq(7000, 10)))
    assert d.commit(plan.request_id, seq(8, 5), cold=True) == Orders(free=(1,))
    stats = d.manager.stats()
    assert (stats.entries, stats.restores_lost) == (1, 1)


def test_release_frees_every_id_the_plan_gave_and_what_the_actor_stored():
    d = Driver()
    plan = d.plan(tokens(seq(1000, 500), seq(7000, 100)), anchor_len=500)
    assert d.release(plan.request_id, taken=1) == Orders(free=(1, 2))
    assert d.manager.stats().anchors == 0 and d.manager.release(Release("unknown")) == Orders()


def test_a_capture_prefill_never_reached_is_freed_at_commit():
    d = Driver()
    plan = d.plan(tokens(seq(1000, 500), seq(7000, 100)), anchor_len=500)
    assert d.commit(plan.request_id, seq(8, 5), taken=0) == Orders(free=(2,))
    assert d.checkpoints(1) == {600: "reply"}


# -- bad input ------------------------------------------------------------------------------------


def test_bad_input_raises_value_error_naming_it():
    m = CacheManager(CacheConfig())
    prompt = np.arange(1, 50, dtype=np.int32)
    with pytest.raises(ValueError, match="prompt"):
        m.plan(PlanRequest("r", np.zeros(0, np.int32)))
    with pytest.raises(ValueError, match="anchor_len 60"):
        m.plan(PlanRequest("r", prompt, anchor_len=60))
    plan = m.plan(PlanRequest("r", prompt))
    with pytest.raises(ValueError, match="already planned"):
        m.plan(PlanRequest("r", prompt))
    good = Commit("r", "", plan.new_entry_id, prompt, 49, None, 0, (), KVPT, STATE)
    for bad in (
        Commit("x", "", 1, prompt, 49, None, 0, (), KVPT, STATE),
        Commit("r", "", 9, prompt, 49, None, 0, (), KVPT, STATE),
        Commit("r", "", 1, prompt, 49, 3, 10, (), KVPT, STATE),
        Commit("r", "", 1, prompt, 49, None, 0, (CapturedPoint(10, "guard"),), KVPT, STATE),
    ):
        with pytest.raises(ValueError):
            m.commit(bad)
        m.check_invariants()
    assert m.commit(good) == Orders()
    with pytest.raises(ValueError, match="indexed"):
        m.release(Release("r2", stored=(1,)))
    with pytest.raises(ValueError, match="guard_offset"):
        CacheManager(CacheConfig(guard_offset=0))


# -- the RAM tier while Orders are on their way ----------------------------------------


@pytest.mark.parametrize("eager", [False, True])
def test_a_new_entry_enters_the_tier_with_the_orders_that_make_its_room(eager):
    """The actor keeps a finished request's entry aside until its commit's Orders (with
    the frees that make its room) arrive. Stored at once (`eager`, as the RAM tier did),
    it would hold more than the budget while those Orders travel."""
    d = Driver(ram_budget=2 * CONVERSATION)
    conversation(d, 1)
    conversation(d, 2)
    d.actor.eager, d.hold = eager, True
    plan = d.plan(seq(300_000, 200))
    if eager:
        with pytest.raises(AssertionError):  # Driver.check_budget: three held, two fit
            d.commit(plan.request_id, seq(350_000, 20))
        return
    assert d.commit(plan.request_id, seq(350_000, 20)) == Orders(free=(1,))
    assert set(d.actor.stored) == {1, 2} and d.actor.nbytes == 2 * CONVERSATION  # in transit
    d.deliver()
    assert set(d.actor.stored) == {2, 3} and d.actor.nbytes == 2 * CONVERSATION


@pytest.mark.parametrize("room", [True, False])
def test_a_file_load_waits_for_the_orders_that_make_its_room(tmp_path, room):
    """A plan that restores from a file indexes its entry and evicts for it; the actor
    loads the file only once it applied those evictions (CacheManager.room)."""
    d = DiskDriver(tmp_path, ram_budget=2 * CONVERSATION)
    try:
        for k in (1, 2, 3):
            conversation(d, k)  # the third evicts the first from RAM; its file stays
        assert set(d.actor.stored) == {2, 3} and 1 in d.manager.disk_index
        plan = d.plan(tokens(seq(100_000, 200), seq(150_000, 20), seq(7, 10)))
        assert (plan.entry_id, plan.length, plan.load_from_disk) == (1, 220, True)
        assert d.manager.pending_orders == Orders(free=(2,))  # evicted for it, not handed out
        if not room:  # the file read into RAM before that free arrives
            d.actor.load(plan)
            with pytest.raises(AssertionError):
                d.check_budget()
            return
        assert d.restore(plan.request_id)
        assert set(d.actor.stored) == {1, 3} and d.actor.nbytes <= 2 * CONVERSATION
        d.commit(plan.request_id, seq(8, 5))
        assert d.manager.stats().restores_lost == 0
    finally:
        d.close()


def test_an_entry_indexed_again_before_its_free_goes_out_keeps_its_ram_size(tmp_path):
    """An entry evicted at a plan, its free not handed out yet, and indexed again from its
    file by the next plan: the actor still holds the RAM version, log-probabilities
    included, and the index counts that one (not the file's, which has none)."""
    d = DiskDriver(tmp_path, ram_budget=2 * CONVERSATION + 2 * 4096)
    d.actor.logits_bytes = 4096
    try:
        for k in (1, 2, 3):
            conversation(d, k)
        assert set(d.actor.stored) == {2, 3}
        first = d.plan(tokens(seq(100_000, 200), seq(150_000, 20), seq(7, 10)))  # file 1
        assert first.load_from_disk and d.manager.pending_orders.free == (2,)
        second = d.plan(tokens(seq(200_000, 200), seq(250_000, 20), seq(7, 10)))  # 2 again
        assert (second.entry_id, second.length) == (2, 220)
        assert 2 not in d.manager.pending_orders.free, "its free is taken back"
        d.check()  # the index counts what the actor holds under id 2
        d.commit(second.request_id, seq(8, 5))
        d.commit(first.request_id, seq(9, 5))
    finally:
        d.close()
