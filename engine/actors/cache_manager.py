"""The cache-manager actor: a thin Ray shell over engine.cache.CacheManager.

One actor serializes every cache decision, so the policy needs no locks. It
holds no tensors: token arrays, lengths, kinds, sizes and ids.
"""

from __future__ import annotations

import ray

from engine.cache.manager import CacheManager
from engine.config import CacheConfig
from engine.messages import (
    AnchorCommit,
    CacheStatsSnapshot,
    Commit,
    Orders,
    PlanRequest,
    Release,
    RestorePlan,
)


@ray.remote(num_cpus=0)
class CacheManagerActor:
    def __init__(self, config: CacheConfig, fingerprint: str, has_state_layers: bool):
        self.manager = CacheManager(
            config, fingerprint=fingerprint, has_state_layers=has_state_layers
        )

    def plan(self, req: PlanRequest) -> RestorePlan:
        return self.manager.plan(req)

    def commit(self, commit: Commit) -> Orders:
        return self.manager.commit(commit)

    def commit_anchor(self, anchor: AnchorCommit) -> Orders:
        return self.manager.commit_anchor(anchor)

    def release(self, release: Release) -> Orders:
        return self.manager.release(release)

    def stats(self) -> CacheStatsSnapshot:
        return self.manager.stats()
