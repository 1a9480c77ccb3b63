"""The cache page's figures (engine.server.observe.cache_view): misses in words, a tenant's requests
alone, the memory shares for the operator only, and their translation to the CacheTree
reply (no Ray)."""

from __future__ import annotations

import pytest

from engine.cache.kinds import MissKind
from engine.cache.messages import Miss
from engine.cache.tree import CacheTree, TreeCheckpoint, TreeEntry
from engine.config import GB, EngineConfig, share_memory
from engine.server.observe.activity import Activity
from engine.server.observe.cache_view import cache_view, miss_words
from engine.server.rpc.replies import to_tree_reply
from tests.server.test_activity import finished


@pytest.mark.parametrize(
    "kind, token, message, words",
    [
        ("", 0, 0, ""),
        ("system", 812, 0, "the system prompt changed at token 812, in message 0"),
        ("tools", 40, -1, "the tools changed at token 40, before the first message"),
        ("history", 900, 3, "an earlier message was edited or dropped at token 900, in message 3"),
        (
            "evicted",
            0,
            -1,
            "the cache it continues was evicted at token 0, before the first message",
        ),
    ],
)
def test_miss_in_words(kind, token, message, words):
    assert miss_words(kind, token, message) == words


def _activity() -> Activity:
    a = Activity()
    a.record(finished("r1", "none", 100, 0, 5, 40.0), "t1", owner=("acme", "s1"))
    miss = Miss(MissKind.SYSTEM, 50, 0, 200)
    a.record(finished("r2", "anchor", 120, 60, 5, 9.0), "t1", miss=miss, owner=("acme/dev", "s2"))
    a.record(finished("r3", "entry", 100, 99, 5, 2.0), "t2", owner=("zeta", "s3"))
    return a


TREE = CacheTree(
    "lineage",
    (
        TreeEntry(
            7,
            "acme",
            "conversation",
            30,
            20,
            999,
            "ram",
            3,
            10,
            500,
            (TreeCheckpoint(20, "reply", 64),),
            ("s1",),
            4,
        ),
    ),
    ram_bytes=999,
)


def test_a_tenant_sees_its_requests_and_no_memory_shares_the_operator_everything():
    shares = share_memory(EngineConfig(), 4 * GB, 1 << 10, 4096, machine=64 * GB, draft=GB // 2)
    tenant = cache_view(TREE, _activity(), "acme", 50, None)
    assert [r.request_id for r in tenant.recent] == ["r2", "r1"]  # newest first, acme/dev too
    assert tenant.recent[0].miss == "the system prompt changed at token 50, in message 0"
    assert (tenant.memory_limit, tenant.memory) == (0, ())
    operator = cache_view(TREE, _activity(), None, 2, shares)
    assert [r.request_id for r in operator.recent] == ["r3", "r2"]
    parts = {p.name: p for p in operator.memory}
    assert operator.memory_limit == shares.limit
    assert parts["draft model"].nbytes == GB // 2 and parts["RAM tier"].used == 999
    assert sum(p.nbytes for p in operator.memory) == shares.total


def test_the_reply_carries_every_field():
    reply = to_tree_reply(cache_view(TREE, _activity(), None, 50, None))
    (entry,) = reply.entries
    assert (entry.entry_id, entry.parent, entry.shared, entry.own_bytes) == (7, 3, 10, 500)
    assert [(c.kind, c.length, c.nbytes) for c in entry.checkpoints] == [("reply", 20, 64)]
    assert list(entry.sessions) == ["s1"] and reply.ram_bytes == 999
    assert [r.session for r in reply.recent] == ["s3", "s2", "s1"]
    assert reply.memory_limit == 0


def test_a_tenant_sees_its_own_namespace_whatever_it_names_and_no_memory_shares():
    from engine.config import Identity
    from engine.server.rpc.service import tree_scope
    from engine.server.security.auth import Authenticator

    auth = Authenticator((Identity("op", "", admin=True), Identity("al", "alice")))
    bearer = lambda token: (("authorization", f"Bearer {token}"),)  # noqa: E731
    assert tree_scope(auth, bearer("al"), "bob") == ("alice", False)
    assert tree_scope(auth, bearer("al"), None) == ("alice", False)
    assert tree_scope(auth, bearer("op"), "bob") == ("bob", True)
    assert tree_scope(auth, bearer("op"), None) == (None, True)
    assert tree_scope(Authenticator(), (), "bob") == ("bob", True)  # no tokens: loopback


def test_the_operators_reply_carries_the_disk_tier_and_each_writer():
    from types import SimpleNamespace

    from engine.cache.messages import CacheStats
    from engine.server.observe.activity import TierFigures, disk_figures
    from engine.server.observe.cache_view import disk_view

    writer = {"files": 9, "refused": 1, "no_space": 3, "failed": 0, "skipped": 0}
    replicas = [
        SimpleNamespace(name="0", **disk_figures({"writer": writer, "paused_s": 4.0})),
        SimpleNamespace(name="1", **disk_figures({"writer": {"files": 2}, "paused_s": 0.0})),
        SimpleNamespace(name="2", disk_state="off"),
    ]
    cache = CacheStats("lineage", 0, 0, disk_bytes=700, disk_file_bytes=600, disk_free_bytes=5)
    live = SimpleNamespace(cache=cache, replicas=replicas, tiers=[TierFigures("disk", 700, 1000)])
    reply = to_tree_reply(cache_view(TREE, _activity(), None, 50, None, disk_view(live)))
    d = reply.disk
    assert (d.held_bytes, d.file_bytes, d.free_bytes, d.budget) == (700, 600, 5, 1000)
    assert [(w.replica, w.state, w.files_written) for w in d.writers] == [
        ("0", "paused", 9),
        ("1", "writing", 2),
    ]
    assert dict(d.writers[0].writes_lost) == {
        "queue_full": 1,
        "disk_full": 3,
        "failed": 0,
        "not_held": 0,
    }
    assert not to_tree_reply(cache_view(TREE, _activity(), "alice", 50)).disk.writers


def test_lineage_stats_shows_the_disk_tier_state_lost_writes_and_the_budget_against_files():
    from clients.cli.disk_tier import disk_lines

    snap = {
        "cache": {"disk_bytes": 2048, "disk_file_bytes": 1024, "disk_free_bytes": 1 << 30},
        "replicas": [
            {
                "name": "0",
                "disk_state": "paused",
                "disk_paused_s": 3.0,
                "disk_files_written": 5,
                "disk_writes_lost": {"disk_full": 3, "queue_full": 0},
            },
            {"name": "1", "disk_state": "off"},
        ],
    }
    lines = disk_lines(snap)
    assert len(lines) == 2, lines
    assert "budget holds 2.0 KiB, files on disk 1.0 KiB (differ by 1.0 KiB" in lines[0]
    assert "PAUSED (disk full) 3 s more" in lines[1] and "disk_full 3" in lines[1]
    assert "queue_full" not in lines[1]
    assert disk_lines({"cache": {}, "replicas": [{"name": "0", "disk_state": "off"}]}) == []
