"""The model actor: a thin Ray shell over one replica's ModelLoop.

With several replicas, each is one ModelActor with its own RAM tier; the
cache manager routes requests to them and orders handovers: a replica whose
plan names `fetch_from` asks that peer for the entry (`export_entry`, numpy
arrays through Ray's object store, engine.storage.handover) and stores it
before the request is admitted. Orders that concern a replica other than the
caller arrive through `apply_orders`.

It builds the loop (engine.runtime.loop) with the model, the RAM tier and the
disk tier's store (engine.storage.disk_store), and forwards calls to it. Events
leave through per-request asyncio queues that the streaming `generate` method
drains, several events per Ray yield, never one round trip per token. The
cache manager is reached through `RayCacheLink`: its Orders come back on a
Ray future and are handed to the loop thread, never waited for there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass

import ray

from engine.cache.messages import AnchorCommit, Commit, LostRestore, Orders, Release, Replanned
from engine.config import EngineConfig
from engine.runtime.events import Finished
from engine.runtime.loader import ModelInfo, load_model
from engine.runtime.loop import ModelLoop
from engine.runtime.requests import GenerationRequest
from engine.runtime.tier_stats import TierStats, tier_stats

log = logging.getLogger(__name__)


class RayCacheLink:
    """The Generator's CacheLink to the cache-manager actor (it says which replica calls)."""

    def __init__(self, replica: int = 0):
        self.replica = replica
        self.loop: ModelLoop | None = None  # the loop whose inbox receives the Orders
        self.manager = None  # attached after the manager is built (it needs the fingerprint)

    def commit(self, commit: Commit, on_orders) -> None:
        ref = self.manager.commit.remote(commit, self.replica)
        self._ask(ref, on_orders, commit.request_id)

    def commit_anchor(self, anchor: AnchorCommit, on_orders) -> None:
        ref = self.manager.commit_anchor.remote(anchor, self.replica)
        self._ask(ref, on_orders, anchor.request_id)

    def release(self, release: Release, on_orders) -> None:
        ref = self.manager.release.remote(release, self.replica)
        self._ask(ref, on_orders, release.request_id)

    def replan(self, lost: LostRestore, on_replanned) -> None:
        failed = Replanned(None, Orders())
        ref = self.manager.replan.remote(lost, self.replica)
        self._ask(ref, on_replanned, lost.request_id, failed)

    def _ask(self, ref, on_orders, request_id: str, failed=None) -> None:
        """Hand the Orders to the loop thread when they come; a failed call is logged and
        answered with empty Orders (`failed`), so a waiting request still ends."""

        def done(f) -> None:
            try:
                orders = f.result()
            except Exception:
                log.exception("cache manager call for %s failed", request_id)
                orders = Orders() if failed is None else failed
            self.loop.call(lambda g: on_orders(orders))

        ref.future().add_done_callback(done)


@dataclass
class HandoverStats:
    """Entries this replica fetched from peers, and what they cost."""

    fetched: int = 0
    failed: int = 0
    bytes: int = 0
    seconds: float = 0.0
    exported: int = 0


@ray.remote(num_cpus=0)
class ModelActor:
    def __init__(self, config: EngineConfig, replica: int = 0):
        from engine.actors.names import log_to_stderr
        from engine.runtime.generator import Generator
        from engine.runtime.ram_tier import RamTier
        from engine.storage.disk_store import open_disk_store

        self.replica = replica
        self.info_value: ModelInfo | None = None
        self.link = RayCacheLink(replica)  # its loop and manager are set below and at attach()
        self.peers: list = []  # every replica's handle, by replica number (attach)
        self.handovers = HandoverStats()

        def build() -> Generator:  # on the loop thread
            model, tokenizer, self.info_value = load_model(config)
            disk = open_disk_store(config, self.info_value.fingerprint)
            tier = RamTier(self.info_value.has_state_layers, disk)
            return Generator(model, tokenizer, config, tier, self.link)

        log_to_stderr()
        self.loop = ModelLoop(build)
        self.link.loop = self.loop
        log.info("model actor started: replica %s, cache mode %s", replica, config.cache.mode)

    def info(self) -> ModelInfo:
        return self.info_value

    def attach(self, manager, peers=()) -> None:
        """The cache manager is built after the model (it needs the fingerprint)."""
        self.link.manager = manager
        self.peers = list(peers)

    def node(self) -> str:
        """The Ray node this replica runs on."""
        return ray.get_runtime_context().get_node_id()

    def attached(self) -> bool:
        """False after Ray restarted this actor: it needs attach() again."""
        return self.link.manager is not None

    def apply_orders(self, orders: Orders) -> None:
        """Orders the manager decided at another replica's call (frees of entries held here)."""
        self.loop.call(lambda g: g.obey(orders))

    async def export_entry(self, entry_id: int, wait: float = 0.0):
        """Entry `entry_id` as a PortableEntry (None: not held here).

        With `wait` > 0, an entry a request here is still to capture (an anchor
        in prefill) is waited for, up to `wait` seconds.
        """
        from engine.storage.handover import to_portable

        deadline = time.monotonic() + wait

        def look(g):
            entry = g.tier.entries.get(entry_id)
            if entry is not None:
                return to_portable(entry)
            return "pending" if g.will_capture(entry_id) else None

        while True:
            found = await asyncio.to_thread(self.loop.ask, look)
            if found != "pending" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        if found == "pending" or found is None:
            return None
        self.handovers.exported += 1
        return found

    async def _fetch(self, plan) -> None:
        """Handover: get the plan's restore source from the peer holding it, store it here."""
        from engine.storage.handover import from_portable

        try:
            peer = self.peers[plan.fetch_from]
            portable = await peer.export_entry.remote(plan.entry_id, 300.0 if plan.wait else 0.0)
        except Exception as e:  # a dead peer: the request prefills cold
            log.warning(
                "handover of entry %s from replica %s failed: %s", plan.entry_id, plan.fetch_from, e
            )
            portable = None
        if portable is None:
            self.handovers.failed += 1
            return

        def store(g) -> None:
            if plan.entry_id not in g.tier.entries:
                g.tier.entries[plan.entry_id] = from_portable(portable)

        await asyncio.to_thread(self.loop.ask, store)
        self.handovers.fetched += 1
        self.handovers.bytes += portable.nbytes
        self.handovers.seconds += max(0.0, time.time() - portable.exported_at)

    async def generate(self, req: GenerationRequest):
        """Stream lists of events (Progress, Tokens, Finished) for one request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        while not self.attached():  # restarted by Ray: the watchdog attaches it again
            await asyncio.sleep(0.05)
        finished = False
        if req.plan.fetch_from is not None and req.plan.fetch_from != self.replica:
            await self._fetch(req.plan)
        self.loop.call(lambda g: g.submit(req, emit))
        try:
            while not finished:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                finished = any(isinstance(e, Finished) for e in batch)
                if finished:
                    batch = [self._stamp(e) for e in batch]
                yield batch
        finally:
            if not finished:  # the consumer went away: free the slot
                self.loop.call(lambda g: g.cancel(req.request_id))

    def _stamp(self, event):
        if isinstance(event, Finished):
            return dataclasses.replace(event, replica=str(self.replica))
        return event

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

    def handover_stats(self) -> HandoverStats:
        return self.handovers

    async def tier_stats(self) -> TierStats:
        """RAM tier, pool and disk writer figures, read on the loop thread."""
        return await asyncio.to_thread(self.loop.ask, tier_stats)
