"""A restarted cache manager plans nothing before its resync, and every plan carries the epoch of
the replica it is placed on. The actor on the session's Ray, no model."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cache.messages import PlanRequest
from engine.config import CacheConfig


def test_a_manager_refuses_to_plan_until_resync_then_stamps_each_replicas_epoch(
    ray_session, tmp_path
):
    import ray

    from engine.actors.cache_manager import CacheManagerActor, NotSynchronised

    manager = CacheManagerActor.remote(CacheConfig(cache_dir=str(tmp_path)), "fp", True, 2)
    try:
        prompt = np.arange(100, 400, dtype=np.int32)
        with pytest.raises(NotSynchronised):  # a new incarnation: ids from 1, nothing held
            ray.get(manager.plan.remote(PlanRequest("r1", prompt)), timeout=60)
        ray.get(manager.resync.remote(5, 1000, lost=[1]), timeout=60)
        plan = ray.get(manager.plan.remote(PlanRequest("r1", prompt)), timeout=60)
        assert (plan.replica, plan.epoch) == (0, 5)  # replica 1 is not placed on: lost
        assert plan.new_entry_id >= 1000, "an id a replica may still hold"
        ray.get(manager.revived.remote(1, epoch=7), timeout=60)  # reset on its own
        other = ray.get(manager.plan.remote(PlanRequest("r2", prompt + 1)), timeout=60)
        assert (other.replica, other.epoch) == (1, 7)
        assert ray.get(manager.audit.remote(), timeout=60).violation == ""
    finally:
        ray.kill(manager)


@pytest.mark.skipif(
    __import__("engine.runtime.malloc", fromlist=["glibc"]).glibc() is None,
    reason="malloc is not glibc's",
)
def test_a_manager_gives_its_free_malloc_pages_back_every_interval(ray_session, tmp_path):
    """Its plans and commits free token arrays and records all day: without a trim what
    they freed stays held in malloc's arenas. `trim_s` 0 trims never."""
    import time

    import ray

    from engine.actors.cache_manager import CacheManagerActor

    config = CacheConfig(cache_dir=str(tmp_path))
    trimming = CacheManagerActor.remote(config, "fp", True, 1, trim_s=0.2)
    never = CacheManagerActor.remote(
        CacheConfig(cache_dir=str(tmp_path / "b")), "fp", True, 1, trim_s=0
    )
    try:
        ray.get([trimming.hello.remote(), never.hello.remote()], timeout=60)
        time.sleep(1.5)
        trims, _ = ray.get(trimming.malloc_trims.remote(), timeout=60)
        assert trims >= 3
        assert ray.get(never.malloc_trims.remote(), timeout=60) == (0, 0)
    finally:
        ray.kill(trimming)
        ray.kill(never)
