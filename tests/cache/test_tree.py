"""The cache as a tree (engine.cache.tree, CacheManager.tree): anchors, the conversations on
them with their checkpoints, session keys, namespaces kept apart. Fake model actors."""

from __future__ import annotations

from engine.cache.tree import PRUNE_MIN, SessionEntries, visible
from tests.cache.test_replicas import ReplicaDriver, convo
from tests.fakes import entry_bytes


def _two_sessions(namespace: str = "") -> ReplicaDriver:
    """Two conversations on one system prompt (an anchor), each with a second turn."""
    d = ReplicaDriver(replicas=1)
    for session, user in (("alpha", range(5000, 5100)), ("beta", range(6000, 6100))):
        first = d.plan(convo(user), anchor_len=300, session=session, namespace=namespace)
        d.commit(first.request_id, reply=range(7000, 7010))
        grown = convo(user, range(7000, 7010), range(user.start + 200, user.start + 300))
        second = d.plan(grown, anchor_len=300, session=session, namespace=namespace)
        d.commit(second.request_id, reply=range(8000, 8010))
    return d


def test_anchor_then_its_conversations_with_sessions_and_restore_points():
    d = _two_sessions()
    tree = d.cache.manager.tree()
    anchors = [e for e in tree.entries if e.role == "anchor"]
    convs = [e for e in tree.entries if e.role == "conversation"]
    assert tree.entries[0] is anchors[0] and len(anchors) == 1  # anchors come first
    anchor = anchors[0]
    assert (anchor.length, anchor.parent, anchor.tier, anchor.checkpoints) == (300, 0, "ram", ())
    assert sorted(s for c in convs for s in c.sessions) == ["alpha", "beta"]
    for c in convs:  # each conversation absorbed its first turn: one entry per session
        assert (c.parent, c.shared, c.tier) == (anchor.entry_id, anchor.length, "ram")
        assert c.length == 300 + 100 + 10 + 100 + 10 and c.prompt_len == c.length - 10
        kinds = {(p.kind, p.length) for p in c.checkpoints}
        assert ("reply", c.prompt_len) in kinds  # the prompt end, kept when the reply followed
        assert ("final", 300 + 100) in kinds  # the first turn's prompt end, absorbed
        assert all(p.nbytes > 0 for p in c.checkpoints)
        rows = d.cache.manager.index.get(c.entry_id).kv_bytes_per_token * anchor.length
        assert c.own_bytes == c.nbytes - rows > 0  # the anchor's rows are counted on the anchor
    stats = d.cache.stats()
    assert tree.ram_bytes == stats.ram_bytes and tree.left_out == 0


def test_a_tenant_scope_holds_its_own_entries_only():
    d = _two_sessions("acme")
    other = d.plan(convo(range(9000, 9100)), anchor_len=300, session="gamma", namespace="zeta")
    d.commit(other.request_id)
    everything = d.cache.manager.tree()
    acme = d.cache.manager.tree("acme")
    assert {e.namespace for e in everything.entries} == {"acme", "zeta"}
    assert {e.namespace for e in acme.entries} == {"acme"}
    assert "gamma" not in {s for e in acme.entries for s in e.sessions}
    assert d.cache.manager.tree("acm").entries == ()  # a prefix of a name is another name
    assert visible("acme/dev", "acme") and not visible("acmedev", "acme")


def test_session_keys_are_bounded_and_move_with_their_latest_entry():
    s = SessionEntries(max_keys=2)
    s.committed("", "a", 1)
    s.committed("", "b", 2)
    s.committed("", "a", 3)
    s.committed("", "c", 4)  # "b" is the least recent: it goes
    s.committed("", "", 5)  # no key: nothing kept
    assert s.by_entry() == {3: ["a"], 4: ["c"]}


def test_sessions_that_come_and_go_leave_keys_only_for_entries_held():
    """Hundreds of one-turn sessions through a RAM tier that holds a few: the session keys
    kept follow what the tiers hold, not the sessions ever seen."""
    d = ReplicaDriver(replicas=1, ram_budget=4 * entry_bytes(330, 3))
    for k in range(600):
        user = range(10_000 + 200 * k, 10_100 + 200 * k)
        plan = d.plan(convo(user), session=f"agent-{k}")
        d.commit(plan.request_id, reply=range(7000, 7010))
    manager = d.cache.manager
    held = len(manager.index.entries())
    assert 0 < held < 10
    entry_of = manager.session_entries.entry_of
    assert len(entry_of) <= max(PRUNE_MIN, 2 * held), len(entry_of)
    assert not d.cache.replicas.sessions.replica_of  # one replica: nothing to route
    shown = {s for e in manager.tree().entries for s in e.sessions}
    assert shown and shown <= {f"agent-{k}" for k in range(600)}
    # what the page shows is every kept key whose entry a tier holds, the latest among them
    held_ids = {e.id for e in manager.index.entries()}
    assert shown == {s for (_, s), e in entry_of.items() if e in held_ids}
    assert "agent-599" in shown and "agent-0" not in {s for _, s in entry_of}
