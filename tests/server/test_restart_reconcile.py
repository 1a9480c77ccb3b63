"""A restarted replica's leftovers: the directory and the disk index agree again.

Real entry files (fake bodies) in a real locked directory, the real policy
with two replicas; the replica's death is played by applying only part of its
Orders. No Ray: `reconcile` is what `CacheManagerActor.revived` runs.
"""

from __future__ import annotations

from dataclasses import replace

from engine.actors.cache_manager import reconcile
from engine.cache import CacheManager
from engine.cache.messages import PlanRequest
from engine.cache.replicated import ReplicatedCache
from engine.config import CacheConfig
from engine.storage import file_format
from engine.storage.directory import open_cache_directory
from tests.fakes import FakeDiskActor, tokens


def seq(start: int, n: int) -> range:
    return range(start, start + n)


def test_a_restart_deletes_what_the_dead_writer_was_to_delete_and_forgets_what_it_never_wrote(
    tmp_path,
):
    config = CacheConfig(cache_dir=str(tmp_path))
    opened = open_cache_directory(config, "fake")
    try:
        manager = CacheManager(config, fingerprint="fake", disk_index=opened.index)
        cache = ReplicatedCache(manager, 2)
        cache.place(["here", "here"], "here")
        actor = FakeDiskActor(directory=opened.path, fingerprint="fake")

        def turn(rid: str, prompt, reply, apply=lambda orders: actor.apply(orders)) -> None:
            plan = cache.plan(PlanRequest(rid, tokens(prompt)))
            assert plan.replica == 0 or plan.entry_id is None
            plan = replace(plan, replica=0)
            actor.load(plan) if plan.load_from_disk else None
            commit = actor.prefill(plan, tokens(prompt), tokens(reply))
            actor.enter(rid)
            orders = cache.commit(replace(commit, namespace=""))
            apply(orders.get(0))

        def dying(orders) -> None:  # wrote the new file, died before the superseded delete
            records = tuple(replace(r, supersedes=()) for r in orders.records)
            actor.apply(replace(orders, records=records))

        first = [seq(1000, 300), seq(5000, 20)]
        turn("r1", first[0], first[1])  # entry 1 and its file
        turn("r2", tokens(*first, seq(6000, 30)), seq(7000, 20), dying)  # absorbs 1
        turn("r3", seq(20_000, 300), seq(21_000, 20), lambda orders: None)  # never applied
        quarantined = file_format.entry_path(opened.path, 99).with_suffix(
            file_format.DAMAGED_SUFFIX
        )
        quarantined.write_bytes(b"kept for the next start's scan")
        assert opened.entry_ids() == {1, 2}  # 1 should be gone; 3 was never written
        assert set(opened.index.files) == {2, 3}

        cache.place(["there", "here"], "here")  # replica 0 on another machine: not ours
        assert reconcile(opened, cache, 0) == ([], [])
        cache.place(["here", "here"], "here")
        assert reconcile(opened, cache, 0) == ([3], [1])
        assert opened.entry_ids() == set(opened.index.files) == {2}
        assert quarantined.exists()
        assert manager.stats().disk_writes_lost == 1
        manager.check_invariants()
    finally:
        opened.close()
