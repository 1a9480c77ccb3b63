"""An in-process engine for benchmarks: the server's Generator and CacheManager, no Ray.

The same classes the actors wrap, driven on the calling thread, so a benchmark
measures the engine's own path (plan, restore, batch merge, prefill, capture,
commit) without process hops, and can also time the bare model forward on the
same caches in the same run.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from engine.cache.manager import CacheManager
from engine.config import EngineConfig
from engine.events import Finished, GenerationRequest, SamplingParams, Tokens
from engine.messages import PlanRequest


@dataclass
class TurnResult:
    ids: list
    final: Finished
    plan: object
    ttft_ms: float


class LocalEngine:
    def __init__(self, config: EngineConfig):
        from engine.actors.model import load_model
        from engine.generator import Generator
        from engine.store import RamTier

        self.config = config
        self.model, self.tokenizer, self.info = load_model(config)
        # RAM tier only: a benchmark must not lock or write the user's disk cache.
        self.manager = CacheManager(
            config.cache, self.info.fingerprint, self.info.has_state_layers, disk=False
        )
        self.tier = RamTier(self.info.has_state_layers)
        self.generator = Generator(
            self.model,
            self.tokenizer,
            config,
            self.tier,
            send_commit=lambda c, done: done(self.manager.commit(c)),
            send_release=lambda r: self.generator.apply_orders(self.manager.release(r)),
            send_anchor=lambda a, done: done(self.manager.commit_anchor(a)),
        )
        self._ids = itertools.count()

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
        while self.generator.busy:
            self.generator.step()
            if first is None and any(isinstance(e, Tokens) for e in events):
                first = time.perf_counter()
        final = next(e for e in events if isinstance(e, Finished))
        ids = [i for e in events if isinstance(e, Tokens) for i in e.ids]
        ttft = ((first or time.perf_counter()) - t0) * 1000
        return TurnResult(ids, final, plan, ttft)
