"""The model actor: a thin Ray shell over one replica's ModelLoop.

With several replicas, each is one ModelActor with its own RAM tier; the
cache manager routes requests to them and orders handovers: a replica whose
plan names `fetch_from` asks that peer for the entry (`export_entry`, numpy
arrays through Ray's object store, engine.storage.handover) and stores it
before the request is admitted. Orders that concern a replica other than the
caller arrive through `apply_orders`.

It builds the loop (engine.runtime.loop) with the model, the RAM tier and the
disk tier's store (engine.storage.disk_store), and forwards calls to it. A
request comes as a Ray call (`submit`); its events leave on the front end's
event stream (engine.actors.event_stream): every event a step of the loop
emits, for every request of that front end, in one frame after the step,
never a Ray round trip per token. The cache manager is reached through
`RayCacheLink`: its Orders come back on a Ray future and are handed to the
loop thread, never waited for there.

Supervision (engine.server.supervision.supervisor drives it): Ray restarts the actor when
its process dies. Each incarnation has an id that `hello` reports with the
epoch it was last synchronised to, and whether its loop thread answered a
ping in time; `resync` ends every request UNAVAILABLE, empties the RAM tier,
flushes the disk writer and attaches the manager and peers under a new epoch.
A request planned before the replica's last resync is refused, and so are
Orders answered in an earlier epoch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field

import ray

from engine.actors.event_stream import EventAddress, EventServer
from engine.actors.hello import Hello
from engine.cache.messages import AnchorCommit, Commit, LostRestore, Orders, Release, Replanned
from engine.config import EngineConfig
from engine.runtime.events import Finished, FinishReason
from engine.runtime.loop import ModelLoop
from engine.runtime.model.loader import ModelInfo, load_model
from engine.runtime.requests import GenerationRequest
from engine.runtime.tier.stats import GeneratorStats, generator_stats

log = logging.getLogger(__name__)


class RayCacheLink:
    """The Generator's CacheLink to the cache-manager actor (it says which replica calls).

    Every call has a deadline: past it the waiting request ends as if the
    manager had answered nothing (the late answer is still applied). Answers of
    an earlier epoch (a manager that was restarted since) are not applied.
    """

    def __init__(self, replica: int = 0, deadline: float = 30.0):
        self.replica = replica
        self.loop: ModelLoop | None = None  # the loop whose inbox receives the Orders
        # fetch(plan, then): the actor's handover of a plan's source from a peer; `then`
        # runs when it is over (set at resync, on the actor's event loop)
        self.fetch = None
        self.manager = None  # attached at resync (the manager needs the fingerprint first)
        self.epoch = -1
        self.deadline = deadline

    def commit(self, commit: Commit, on_orders) -> None:
        ref = self.manager.commit.remote(commit, self.replica)
        self._ask(ref, on_orders, commit.request_id)

    def commit_anchor(self, anchor: AnchorCommit, on_orders) -> None:
        ref = self.manager.commit_anchor.remote(anchor, self.replica)
        self._ask(ref, on_orders, anchor.request_id)

    def release(self, release: Release, on_orders) -> None:
        ref = self.manager.release.remote(release, self.replica)
        self._ask(ref, on_orders, release.request_id)

    def room(self, request_id: str, on_orders) -> None:
        ref = self.manager.room.remote(request_id, self.replica)
        self._ask(ref, on_orders, request_id)

    def replan(self, lost: LostRestore, on_replanned) -> None:
        failed = Replanned(None, Orders())
        ref = self.manager.replan.remote(lost, self.replica)
        self._ask(ref, self._fetched(on_replanned), lost.request_id, failed)

    def _fetched(self, on_replanned):
        """`on_replanned`, once a new plan's restore source held by a peer (`fetch_from`) is
        fetched here (`fetch`, the actor's handover), so the request does not go cold."""

        def answered(replanned: Replanned) -> None:  # on the loop thread
            plan = replanned.plan
            if plan is None or plan.fetch_from in (None, self.replica) or self.fetch is None:
                return on_replanned(replanned)
            self.fetch(plan, lambda: self.loop.call(lambda g: on_replanned(replanned)))

        return answered

    def _ask(self, ref, on_orders, request_id: str, failed=None) -> None:
        """Hand the Orders to the loop thread when they come; a failed or late call is logged
        and answered with empty Orders (`failed`), so a waiting request still ends."""
        epoch, answered, lock = self.epoch, [False], threading.Lock()
        empty = Orders() if failed is None else failed

        def answer(orders, why: str = "") -> None:
            with lock:
                first, answered[0] = not answered[0], True
            if why:
                log.error("cache manager call for %s: %s", request_id, why)
            current = epoch == self.epoch
            if first:
                self.loop.call(lambda g: on_orders(orders if current else empty))
            elif current and isinstance(orders, Orders) and orders:  # late: frees still hold
                self.loop.call(lambda g: g.apply_unasked(orders))

        def done(f) -> None:
            timer.cancel()
            try:
                orders = f.result()
            except Exception as e:
                return answer(empty, f"failed ({type(e).__name__}: {e})")
            answer(orders)

        timer = threading.Timer(self.deadline, answer, (empty, "no answer within deadline"))
        timer.daemon = True
        timer.start()
        ref.future().add_done_callback(done)


@dataclass
class HandoverStats:
    """Entries this replica fetched from peers, and what they cost."""

    fetched: int = 0
    failed: int = 0
    bytes: int = 0
    seconds: float = 0.0
    exported: int = 0
    records: list = field(default_factory=list)  # (tokens, bytes, seconds), the last 256

    def add(self, tokens: int, nbytes: int, seconds: float) -> None:
        self.fetched += 1
        self.bytes += nbytes
        self.seconds += seconds
        self.records = [*self.records[-255:], (tokens, nbytes, seconds)]


@ray.remote(num_cpus=0)
class ModelActor:
    def __init__(self, config: EngineConfig, replica: int = 0):
        from engine.actors.names import log_to_stderr
        from engine.runtime.generator import Generator
        from engine.runtime.tier.ram import RamTier
        from engine.storage.disk_store import open_disk_store

        self.replica = replica
        self.info_value: ModelInfo | None = None
        self.incarnation = uuid.uuid4().hex
        self.epoch = -1  # set by resync; requests planned before it are refused
        self.link = RayCacheLink(replica, config.server.call_deadline)  # manager: resync()
        self.peers: list = []  # every replica's handle, by replica number (attach)
        self.handovers = HandoverStats()

        def build() -> Generator:  # on the loop thread
            model, tokenizer, self.info_value = load_model(config)
            disk = open_disk_store(config, self.info_value.fingerprint)
            if disk is not None:
                disk.on_report = lambda: self._report_disk(disk)
            tier = RamTier(self.info_value.has_state_layers, disk)
            return Generator(model, tokenizer, config, tier, self.link)

        log_to_stderr()
        self.event_servers: dict[str, EventServer] = {}  # listening host -> server
        self.streams: dict[str, str] = {}  # request id -> the event stream it answers on
        self.loop = ModelLoop(build, flush=self._flush_events)
        self.link.loop = self.loop
        log.info("model actor started: replica %s, cache mode %s", replica, config.cache.mode)

    def _report_disk(self, disk) -> None:
        """Writes the disk writer lost or did (on its thread): the manager's disk index
        forgets the lost ones, and lets the other replicas of the machine read the written
        ones; when writing resumed after a full disk, it orders the lost ones written
        again. Without a manager (not attached yet, restarting) its next scan finds the
        directory as it is."""
        lost, written = disk.take_lost(), disk.take_written()
        resumed = disk.take_resumed()
        manager = self.link.manager
        if lost and manager is not None:
            manager.files_lost.remote(lost, self.replica)
        if written and manager is not None:
            manager.files_written.remote(written, self.replica)
        if resumed and manager is not None:
            manager.disk_resumed.remote(self.replica)

    @ray.method(max_task_retries=3)
    def info(self) -> ModelInfo:
        return self.info_value

    def attach(self, manager, peers=()) -> None:
        """The cache manager is built after the model (it needs the fingerprint)."""
        self.link.manager = manager
        self.peers = list(peers)

    async def hello(self, loop_deadline: float = 10.0) -> Hello:
        """Who this incarnation is, and whether the model loop answers within the deadline."""
        loop = asyncio.get_running_loop()
        pong = loop.create_future()
        self.loop.call(lambda g: loop.call_soon_threadsafe(_settle, pong))
        try:
            await asyncio.wait_for(pong, loop_deadline)
            ok = self.loop.alive
        except asyncio.TimeoutError:
            ok = False
        return Hello(self.incarnation, self.epoch, os.getpid(), ok)

    async def resync(
        self,
        epoch: int,
        manager,
        peers=(),
        max_batch_tokens: int | None = None,
        pool_limit: int | None = None,
        flush_timeout: float = 30.0,
    ) -> int:
        """Start `epoch` with this manager: every request ends UNAVAILABLE, the RAM tier
        empties, the disk writer flushes. Returns the largest entry id this replica has
        held or queued (the manager allocates above it)."""

        def reset(g) -> int:
            g.reset(f"the engine restarted (epoch {epoch})")
            g.set_limits(max_batch_tokens, pool_limit)
            self.link.epoch, self.epoch = epoch, epoch
            self.attach(manager, peers)
            disk = g.tier.disk_tier
            return max(g.tier.max_id, disk.max_queued_id() if disk is not None else 0)

        max_id = await asyncio.to_thread(self.loop.ask, reset, flush_timeout)
        aio = asyncio.get_running_loop()

        def fetch(plan, then) -> None:  # from the loop thread: a replanned request's source
            asyncio.run_coroutine_threadsafe(self._fetch_then(plan, then), aio)

        self.link.fetch = fetch
        await self.flush_disk(flush_timeout)
        return max_id

    def release(self, request_id: str) -> None:
        """End a planned request that never ran (its caller gave up while it was planned)."""
        self.loop.call(
            lambda g: g.order_ledger.release(Release(request_id=request_id), g.tier.apply)
        )

    def node(self) -> str:
        """The Ray node this replica runs on."""
        return ray.get_runtime_context().get_node_id()

    def machine(self) -> str:
        """The machine (IP address) this replica runs on: replicas of one share its disk."""
        return ray.util.get_node_ip_address()

    def attached(self) -> bool:
        """False after Ray restarted this actor: it needs attach() again."""
        return self.link.manager is not None

    def apply_orders(self, orders: Orders) -> None:
        """Orders the manager decided at another replica's call (frees of entries held here)."""
        self.loop.call(lambda g: g.apply_unasked(orders))

    async def export_entry(self, entry_id: int, wait: float = 0.0, from_disk: bool = False):
        """Entry `entry_id` as a PortableEntry (None: not held here).

        With `wait` > 0, an entry a request here is still to capture (an anchor
        in prefill) is waited for, up to `wait` seconds. With `from_disk`, an
        entry not in RAM is read from this machine's cache directory (a file
        handed over to a replica on another machine; it stays out of RAM here).
        """
        from engine.storage.handover import to_portable

        deadline = time.monotonic() + wait

        def look(g):
            entry = g.tier.held(entry_id)  # staged too: its commit's Orders are coming
            if entry is None and from_disk and g.tier.disk_tier is not None:
                entry = g.tier.disk_tier.load(entry_id)
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

    async def _fetch(self, plan, tokens=None) -> None:
        """Handover: get the plan's restore source from the peer holding it, store it here,
        unless it holds other tokens than the request's first `plan.length` (`tokens`,
        when known; a restore checks them again)."""
        from engine.storage.handover import from_portable

        try:
            peer = self.peers[plan.fetch_from]
            wait = 300.0 if plan.wait else 0.0
            portable = await peer.export_entry.remote(plan.entry_id, wait, plan.load_from_disk)
        except Exception as e:  # a dead peer: the request prefills cold
            log.warning(
                "handover of entry %s from replica %s failed: %s", plan.entry_id, plan.fetch_from, e
            )
            portable = None
        if portable is None:
            self.handovers.failed += 1
            return

        def store(g) -> None:
            entry = from_portable(portable)
            if tokens is not None and not g.tier.matches(entry, tokens[: plan.length]):
                return  # refused (counted, logged): the restore is lost and replanned
            if plan.entry_id not in g.tier.entries:
                g.tier.put(plan.entry_id, entry)

        await asyncio.to_thread(self.loop.ask, store)
        seconds = max(0.0, time.time() - portable.exported_at)
        self.handovers.add(portable.length, portable.nbytes, seconds)

    async def _fetch_then(self, plan, then, tokens=None) -> None:
        try:
            await self._fetch(plan, tokens)
        finally:
            then()

    # ---- requests and their events ----------------------------------------------

    def open_events(self, front_end_ip: str) -> EventAddress:
        """Where a front end on `front_end_ip` connects for this replica's events: on the
        loopback from this machine, else on this node's address."""
        here = ray.util.get_node_ip_address()
        host = "127.0.0.1" if front_end_ip in (here, "127.0.0.1") else here
        server = self.event_servers.get(host)
        if server is None:
            server = self.event_servers[host] = EventServer(host, self._stream_lost)
        return server.address

    def _stream_lost(self, stream: str) -> None:
        """A front end went (its connection closed): its requests stop and free their slots."""
        gone = [rid for rid, s in list(self.streams.items()) if s == stream]
        for rid in gone:
            self.loop.call(lambda g, rid=rid: g.cancel(rid))

    def event_stats(self) -> dict:
        """Frames and events sent on the event streams so far."""
        servers = list(self.event_servers.values())
        return {
            "frames": sum(s.frames for s in servers),
            "events": sum(s.events for s in servers),
        }

    def _flush_events(self) -> None:  # on the loop thread, after each step
        for server in self.event_servers.values():
            server.flush()

    async def submit(self, req: GenerationRequest, stream: str) -> str:
        """Queue a request; its events go to event stream `stream`. Returns "" when taken,
        else why not: its plan carries another epoch than this replica's (placed here
        before its last reset, or before its first after Ray restarted it), or an unknown
        stream (a front end that has not connected to this incarnation)."""
        if self.epoch < 0 or req.plan.epoch != self.epoch:
            return f"planned in epoch {req.plan.epoch}, the replica is in {self.epoch}"
        server = next((s for s in self.event_servers.values() if s.connected(stream)), None)
        if server is None:
            return f"event stream {stream} is not connected to this replica"
        self.streams[req.request_id] = stream
        emit = self._stamped(server.emitter(stream, req.request_id), req.request_id)
        if req.plan.fetch_from is not None and req.plan.fetch_from != self.replica:
            then = lambda: self._queue(req, emit)  # noqa: E731
            asyncio.ensure_future(self._fetch_then(req.plan, then, req.tokens))
        else:
            self._queue(req, emit)
        return ""

    def _queue(self, req: GenerationRequest, emit) -> None:
        self.loop.call(lambda g: g.submit(req, emit))

    def _stamped(self, emit, request_id: str):
        """The request's Emit, its Finished stamped with this replica (and its books closed)."""
        replica = str(self.replica)

        def stamped(event) -> None:
            if isinstance(event, Finished):
                self.streams.pop(request_id, None)
                event = dataclasses.replace(event, replica=replica)
            emit(event)

        return stamped

    def stop(self, request_id: str) -> None:
        """The front end found a stop string in the request's text: it ends as at a stop token
        (its entry committed as usual) before the next decode step."""
        self.loop.call(lambda g: g.cancel(request_id, reason=FinishReason.STOP))

    async def cancel(self, request_id: str) -> None:
        """Returns once the cancelled request's cache is committed (or released)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finished() -> None:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

        self.loop.call(lambda g: g.cancel(request_id, finished))
        await done

    async def prompt_end(self, request_id: str, entry_id: int, wait: float) -> str:
        """A request waits for `request_id`'s prompt end (RestorePlan.after_entry): it is
        stored under `entry_id` and indexed as soon as that request has it (while it
        decodes). Returns within `wait` seconds: "stored" (indexed), "ended" (its commit or
        release was answered), "unknown" (not here: not submitted yet, or over), "failed",
        or "waiting" (still in prefill). A caller that gives up takes its ask back."""
        loop = asyncio.get_running_loop()
        answer = loop.create_future()

        def told(outcome: str) -> None:  # on the loop thread
            loop.call_soon_threadsafe(lambda: answer.done() or answer.set_result(outcome))

        self.loop.call(lambda g: g.want_prompt_end(request_id, entry_id, told))
        try:
            return await asyncio.wait_for(asyncio.shield(answer), wait)
        except asyncio.TimeoutError:
            return "waiting"
        finally:
            if not answer.done():
                self.loop.call(lambda g: g.unwant_prompt_end(request_id, told))

    async def flush_disk(self, timeout: float = 60.0) -> bool:
        """Wait until every file ordered so far is written (call before killing the actor)."""
        store = self.loop.generator.tier.disk_tier
        if store is None:
            return True
        return await asyncio.to_thread(store.flush, timeout)

    def handover_stats(self) -> HandoverStats:
        return self.handovers

    async def step_profile(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """The model loop's step times by phase (engine.runtime.batching.step_profile) for steps
        that ended in [since, until], in `time.perf_counter` seconds (one clock per machine)."""
        return await asyncio.to_thread(self.loop.ask, lambda g: g.profile.summary(since, until))

    async def prefill_log(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """Each request's prefill (queued, its chunks, the time between them) and the chunk
        cost fit (engine.runtime.batching.prefill_log), for requests received in [since,
        until], `time.perf_counter` seconds."""
        return await asyncio.to_thread(self.loop.ask, lambda g: g.prefill_log.report(since, until))

    @ray.method(max_task_retries=3)
    async def generator_stats(self) -> GeneratorStats:
        """RAM tier, pool and disk writer figures, read on the loop thread."""
        return await asyncio.to_thread(self.loop.ask, generator_stats)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
