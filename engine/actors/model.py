"""The model actor: a thin Ray shell over one replica's ModelLoop.

It builds the loop (engine.runtime.loop) with the model, the RAM tier and the
disk tier's store (engine.storage.disk_store), and forwards calls to it. Events
leave through per-request asyncio queues that the streaming `generate` method
drains, several events per Ray yield, never one round trip per token. The
cache manager is reached through `RayCacheLink`: its Orders come back on a
Ray future and are handed to the loop thread, never waited for there.
"""

from __future__ import annotations

import asyncio
import logging

import ray

from engine.cache.messages import AnchorCommit, Commit, Orders, Release
from engine.config import EngineConfig
from engine.runtime.events import Finished
from engine.runtime.loader import ModelInfo, load_model
from engine.runtime.loop import ModelLoop
from engine.runtime.requests import GenerationRequest
from engine.runtime.tier_stats import TierStats, tier_stats

log = logging.getLogger(__name__)


class RayCacheLink:
    """The Generator's CacheLink to the cache-manager actor."""

    def __init__(self):
        self.loop: ModelLoop | None = None  # the loop whose inbox receives the Orders
        self.manager = None  # attached after the manager is built (it needs the fingerprint)

    def commit(self, commit: Commit, on_orders) -> None:
        self._ask(self.manager.commit.remote(commit), on_orders, commit.request_id)

    def commit_anchor(self, anchor: AnchorCommit, on_orders) -> None:
        self._ask(self.manager.commit_anchor.remote(anchor), on_orders, anchor.request_id)

    def release(self, release: Release, on_orders) -> None:
        self._ask(self.manager.release.remote(release), on_orders, release.request_id)

    def _ask(self, ref, on_orders, request_id: str) -> None:
        """Hand the Orders to the loop thread when they come; a failed call is logged and
        answered with empty Orders, so a waiting request still ends."""

        def done(f) -> None:
            try:
                orders = f.result()
            except Exception:
                log.exception("cache manager call for %s failed", request_id)
                orders = Orders()
            self.loop.call(lambda g: on_orders(orders))

        ref.future().add_done_callback(done)


@ray.remote(num_cpus=0)
class ModelActor:
    def __init__(self, config: EngineConfig):
        from engine.actors.names import log_to_stderr
        from engine.runtime.generator import Generator
        from engine.runtime.ram_tier import RamTier
        from engine.storage.disk_store import open_disk_store

        self.info_value: ModelInfo | None = None
        self.link = RayCacheLink()  # its loop and manager are set below and at attach()

        def build() -> Generator:  # on the loop thread
            model, tokenizer, self.info_value = load_model(config)
            disk = open_disk_store(config, self.info_value.fingerprint)
            tier = RamTier(self.info_value.has_state_layers, disk)
            return Generator(model, tokenizer, config, tier, self.link)

        log_to_stderr()
        self.loop = ModelLoop(build)
        self.link.loop = self.loop
        log.info("model actor started (cache mode %s)", config.cache.mode)

    def info(self) -> ModelInfo:
        return self.info_value

    def attach(self, manager) -> None:
        """The cache manager is built after the model (it needs the fingerprint)."""
        self.link.manager = manager

    async def generate(self, req: GenerationRequest):
        """Stream lists of events (Progress, Tokens, Finished) for one request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        self.loop.call(lambda g: g.submit(req, emit))
        finished = False
        try:
            while not finished:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                finished = any(isinstance(e, Finished) for e in batch)
                yield batch
        finally:
            if not finished:  # the consumer went away: free the slot
                self.loop.call(lambda g: g.cancel(req.request_id))

    async def cancel(self, request_id: str) -> None:
        """Returns once the cancelled request's cache is committed (or released)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finished() -> None:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

        self.loop.call(lambda g: g.cancel(request_id, finished))
        await done

    async def flush_disk(self, timeout: float = 60.0) -> bool:
        """Wait until every file ordered so far is written (call before killing the actor)."""
        store = self.loop.generator.tier.disk_tier
        if store is None:
            return True
        return await asyncio.to_thread(store.flush, timeout)

    async def tier_stats(self) -> TierStats:
        """RAM tier, pool and disk writer figures, read on the loop thread."""
        return await asyncio.to_thread(self.loop.ask, tier_stats)
