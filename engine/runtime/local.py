"""An in-process engine: the server's Generator and CacheManager on the calling thread, no Ray.

The same classes the actors wrap, driven on the calling thread, so a benchmark
measures the engine's own path (plan, restore, batch merge, prefill, capture,
commit) without process hops, and can also time the bare model forward on the
same caches in the same run.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace

import numpy as np

from engine.cache.disk_index import DiskIndex
from engine.cache.manager import CacheManager
from engine.cache.messages import PlanRequest
from engine.config import EngineConfig
from engine.runtime.events import Finished, Tokens
from engine.runtime.requests import GenerationRequest, SamplingParams
from engine.runtime.tier.ram import DiskTier


@dataclass
class TurnResult:
    ids: list
    final: Finished
    plan: object
    ttft_ms: float


class LocalLink:
    """A CacheLink to an in-process CacheManager: Orders are answered at once."""

    def __init__(self, manager: CacheManager):
        self.manager = manager

    def commit(self, commit, on_orders) -> None:
        on_orders(self.manager.commit(commit))

    def commit_anchor(self, anchor, on_orders) -> None:
        on_orders(self.manager.commit_anchor(anchor))

    def release(self, release, on_orders) -> None:
        on_orders(self.manager.release(release))

    def replan(self, lost, on_replanned) -> None:
        on_replanned(self.manager.replan(lost))

    def room(self, request_id, on_orders) -> None:
        on_orders(self.manager.room(request_id))


class LocalEngine:
    """The cache manager and one Generator on the calling thread."""

    def __init__(
        self,
        config: EngineConfig,
        loaded: tuple | None = None,
        disk_tier: DiskTier | None = None,
        disk_index: DiskIndex | None = None,
    ):
        """`loaded`: (model, tokenizer, ModelInfo) already loaded, else the config's model.

        RAM tier only unless the caller hands a disk tier and its index (the
        storage layer builds both): a benchmark must not lock or write the
        user's disk cache unless it asks to.
        """
        from engine.runtime.generator import Generator
        from engine.runtime.model.loader import load_model
        from engine.runtime.tier.ram import RamTier

        self.config = config
        self.model, self.tokenizer, self.info = loaded or load_model(config)
        cache = config.cache
        if cache.guard_min_suffix is None:  # the threshold measured at load
            cache = replace(cache, guard_min_suffix=self.info.guard_min_suffix)
        self.manager = CacheManager(
            cache, self.info.fingerprint, self.info.has_state_layers, disk_index
        )
        self.tier = RamTier(self.info.has_state_layers, disk_tier)
        self.generator = Generator(
            self.model, self.tokenizer, config, self.tier, LocalLink(self.manager)
        )
        self._ids = itertools.count()

    def report_lost(self) -> list[int]:
        """Tell the manager which file writes were lost or done so far (what ModelActor
        does on the writer's report), and apply the Orders that write the lost ones again;
        the ids its disk index forgot."""
        if self.tier.disk_tier is None:
            return []
        disk = self.tier.disk_tier
        lost = self.manager.files_lost(disk.take_lost())
        for orders in (
            self.manager.files_written(disk.take_written()),
            self.manager.write_lost() if disk.take_resumed() else None,
        ):
            if orders:  # the entries whose writes were lost, ordered written again
                self.generator.apply_unasked(orders)
        return lost

    def run(
        self,
        tokens,
        max_tokens: int = 1,
        anchor_len: int = 0,
        namespace: str = "",
        cold: bool = False,
    ) -> TurnResult:
        """One request to completion; cold=True runs it in a namespace of its own."""
        rid = f"bench-{next(self._ids)}"
        if cold:  # a namespace of its own: nothing stored matches
            namespace = f"cold-{rid}"
        self.report_lost()
        received = time.time()
        t0 = time.perf_counter()
        req = PlanRequest(rid, np.asarray(tokens, dtype=np.int32), anchor_len, namespace)
        plan = self.manager.plan(req)
        plan_ms = (time.perf_counter() - t0) * 1000
        events: list = []
        self.generator.submit(
            GenerationRequest(
                rid,
                namespace,
                tuple(int(t) for t in tokens),
                plan,
                SamplingParams(max_tokens=max_tokens),
                received,
                plan_ms,
            ),
            events.append,
        )
        first = None
        while self.generator.busy or self.generator.pending:
            if not self.generator.busy:  # only waiting for a file on the reader thread
                time.sleep(0.0005)
            self.generator.step()
            if first is None and any(isinstance(e, Tokens) for e in events):
                first = time.perf_counter()
        final = next(e for e in events if isinstance(e, Finished))
        ids = [i for e in events if isinstance(e, Tokens) for i in e.ids]
        ttft = ((first or time.perf_counter()) - t0) * 1000
        return TurnResult(ids, final, plan, ttft)
