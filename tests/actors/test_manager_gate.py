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
