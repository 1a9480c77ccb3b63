"""The cache-manager actor: a thin Ray shell over engine.cache.CacheManager.

One actor serializes every cache decision, so the policy needs no locks. It
holds no tensors: token arrays, lengths, kinds, sizes and ids. At start it
opens the cache directory (engine.storage.directory: lock, header scan) and
hands the disk index it built to the policy.
"""

from __future__ import annotations

import logging

import ray

from engine.actors.names import log_to_stderr
from engine.cache.manager import CacheManager
from engine.cache.messages import (
    AnchorCommit,
    CacheStats,
    Commit,
    Orders,
    PlanRequest,
    Release,
    RestorePlan,
)
from engine.config import CacheConfig
from engine.storage.directory import open_cache_directory

log = logging.getLogger(__name__)


@ray.remote(num_cpus=0)
class CacheManagerActor:
    def __init__(self, config: CacheConfig, fingerprint: str, has_state_layers: bool):
        log_to_stderr()
        self.directory = open_cache_directory(config, fingerprint)
        self.manager = CacheManager(
            config,
            fingerprint=fingerprint,
            has_state_layers=has_state_layers,
            disk_index=self.directory.index if self.directory else None,
        )
        log.info(
            "cache manager started: mode %s, %s",
            config.mode,
            f"cache directory {config.resolved_cache_dir}" if self.directory else "no disk tier",
        )

    def plan(self, req: PlanRequest) -> RestorePlan:
        return self.manager.plan(req)

    def commit(self, commit: Commit) -> Orders:
        return self.manager.commit(commit)

    def commit_anchor(self, anchor: AnchorCommit) -> Orders:
        return self.manager.commit_anchor(anchor)

    def release(self, release: Release) -> Orders:
        return self.manager.release(release)

    def stats(self) -> CacheStats:
        return self.manager.stats()
