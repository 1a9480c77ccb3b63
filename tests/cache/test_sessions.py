"""Session keys route a conversation to the replica that served it last (engine.cache.sessions),
load permitting, scoped by namespace, with a bounded memory. Fake model actors (test_replicas)."""

from __future__ import annotations

import pytest

from engine.cache.sessions import Sessions
from tests.cache.test_replicas import ReplicaDriver, convo
from tests.fakes import tokens


def _busy(d: ReplicaDriver, n: int = 500, start: int = 50_000):
    """A long prefill in flight (no session): it goes to the least loaded replica."""
    return d.plan(range(start, start + n))


def test_a_session_stays_on_its_replica_when_nothing_there_is_its_restore_point():
    d = ReplicaDriver(threshold=100)
    busy = _busy(d)  # replica 0 is busy: the session's first turn goes to 1
    first = d.plan(tokens(range(10, 110), range(5000, 5100)), session="s")
    assert (busy.replica, first.replica) == (0, 1)
    d.commit(first.request_id, reply=range(7000, 7010))
    d.commit(busy.request_id)
    # Its system prompt changed (a timestamp in it): nothing cached restores it, both
    # replicas are idle. Without a key the tie goes to replica 0; with it, to 1.
    moved = tokens(range(20, 120), range(5000, 5100), range(7000, 7010), range(5200, 5250))
    again = d.plan(moved, session="s")
    assert (again.replica, again.kind, again.fetch_from) == (1, "none", None)
    d.commit(again.request_id)
    assert d.plan(moved + 1).replica == 0  # the same prompt, no session
    stats = d.cache.stats().replicas
    assert [r.sessions for r in stats] == [0, 1] and stats[1].session_moves == 0


def test_a_busy_session_replica_sheds_the_turn_and_the_session_moves():
    d = ReplicaDriver(threshold=100)
    first = d.plan(convo(range(5000, 5100)), anchor_len=300, session="s")
    d.commit(first.request_id, reply=range(7000, 7010))
    home = first.replica
    busy = d.plan(range(50_000, 50_800), exclude=(1 - home,))  # 800 queued tokens at home
    turn = d.plan(convo(range(5000, 5100), range(7000, 7010), range(5200, 5300)), session="s")
    assert (turn.replica, turn.fetch_from) == (1 - home, home)  # its entry fetched from home
    assert turn.kind in ("entry", "reply")
    stats = d.cache.stats().replicas
    assert stats[home].session_moves == 1 and stats[1 - home].sessions == 1
    for rid in (turn.request_id, busy.request_id):
        d.commit(rid)
    # Back in balance, the next turn stays where the session went.
    again = d.plan(convo(range(5000, 5100), range(7000, 7010), range(5200, 5400)), session="s")
    assert again.replica == 1 - home and again.fetch_from is None


def test_within_the_threshold_the_session_replica_fetches_what_it_lacks():
    d = ReplicaDriver(threshold=1000)
    holder = d.turn(convo(range(5000, 5100)), anchor_len=300).replica  # the anchor lives here
    elsewhere = 1 - holder
    placed = d.plan(tokens(range(80_000, 80_100)), session="s", exclude=(holder,))
    assert placed.replica == elsewhere
    d.commit(placed.request_id)
    turn = d.plan(convo(range(6000, 6100)), anchor_len=300, session="s")
    assert (turn.replica, turn.fetch_from, turn.kind) == (elsewhere, holder, "anchor")
    d.commit(turn.request_id)


def test_a_session_key_never_crosses_tenants():
    d = ReplicaDriver(threshold=100)
    busy = _busy(d)
    mine = d.plan(tokens(range(10, 60)), session="same-key", namespace="tenant-a")
    assert (busy.replica, mine.replica) == (0, 1)
    for rid in (mine.request_id, busy.request_id):
        d.commit(rid)
    # Idle replicas: tenant b's request with the same key is not steered to tenant a's
    # replica (the tie goes to 0); tenant a's next turn still is.
    theirs = d.plan(tokens(range(90, 140)), session="same-key", namespace="tenant-b")
    assert theirs.replica == 0
    d.commit(theirs.request_id)
    assert d.plan(tokens(range(10, 70)), session="same-key", namespace="tenant-a").replica == 1
    assert [r.sessions for r in d.cache.stats().replicas] == [1, 1]


def test_sessions_are_bounded_least_recently_served_first():
    s = Sessions(max_keys=2)
    s.served("ns", "a", 0)
    s.served("ns", "b", 1)
    s.served("ns", "a", 1)  # a is the most recent now, and moved off 0
    s.served("ns", "c", 0)  # b goes
    assert (s.get("ns", "a"), s.get("ns", "b"), s.get("ns", "c")) == (1, None, 0)
    assert s.moves[0] == 1 and dict(s.counts()) == {1: 1, 0: 1}
    assert s.get("other", "a") is None
    with pytest.raises(ValueError, match="max_keys"):
        Sessions(0)
