"""Supervision: the actors' restarts, the epoch handshake, and health that follows them.

Ray restarts an actor whose process dies (every actor is created with
`max_restarts`). The Supervisor notices through `hello`, which each actor
answers with its incarnation id and the epoch it was last synchronised to; a
model replica also says whether its loop thread answered a ping within
`loop_deadline`. A new incarnation starts a new epoch:

- of the cache manager: every replica resyncs (its requests end UNAVAILABLE,
  its RAM tier empties, its disk writer flushes, the manager is attached) and
  answers the largest entry id it held or queued; then the manager rebuilds
  its index from a fresh scan of the cache directory and allocates ids above
  that one;
- of one replica, or a replica that answers again after it was lost (a
  missed ping, a call that failed, a stream the front end saw die): the
  manager forgets what it held and gives back its requests (`lost`), the
  replica resyncs empty in an epoch of its own (the plans placed on it
  before are refused), and the manager routes to it again (`revived`),
  forgetting the files its writer never wrote and deleting the ones it was
  to delete.

So no stale RAM entry and no reused id survives a restart, and the next
request restores from the disk tier (or a peer). A model loop that misses its
ping twice is wedged: the replica leaves the routing and is killed for Ray to
restart. Health is SERVING while the manager and one replica answer; `ready`
is clear while an epoch is being set up, and new requests wait for it.

It knows the actors' handles and Ray's errors; it holds no request state.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Sequence

import ray
from ray.exceptions import ActorDiedError, RayActorError

from engine.actors.handles import Handle, ManagerCalls, ModelCalls
from engine.config import EngineConfig

log = logging.getLogger("lineage.supervisor")
WEDGED_PINGS = 2  # missed loop pings in a row before the model actor is restarted


class Supervisor:
    """Watches the replicas and the manager; runs the epoch handshake; drives health."""

    def __init__(
        self,
        replicas: Sequence[Handle[ModelCalls]],
        manager: Handle[ManagerCalls],
        config: EngineConfig,
        set_health: Callable[[bool], Awaitable[None]],
        every: float = 1.0,
    ):
        self.replicas = list(replicas)
        self.manager = manager
        self.deadline = config.server.call_deadline
        self.loop_deadline = config.server.loop_deadline
        self.limits = (config.model.max_batch_tokens, config.cache.pool_limit)
        self.set_health = set_health
        self.every = every
        self.epoch = 0
        self.ready = asyncio.Event()  # set while an epoch is up and a replica answers
        self.gone: str | None = None  # why the engine will not come back (killed for good)
        self.restarts = 0  # epochs begun after the first
        self.wedged_restarts = 0
        self._manager_known: str | None = None  # the manager incarnation of this epoch
        self.manager_epoch = 0  # the epoch of the last whole resync: requests carry it
        self._known: list[str | None] = [None] * len(self.replicas)  # replica incarnations
        self._machines: list[str | None] = [None] * len(self.replicas)  # where each one runs
        self._up = [False] * len(self.replicas)  # replicas the manager routes to
        self._missed = [0] * len(self.replicas)  # loop pings missed in a row
        self._healthy = True
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """The first epoch (the actors are up), then the watch loop."""
        await self._sync(rescan=False)
        self._task = asyncio.ensure_future(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def poke(self) -> None:
        """Check the actors now (a call just failed)."""
        self._wake.set()

    async def wait_ready(self, after_epoch: int = 0) -> int:
        """The epoch once one later than `after_epoch` is up.

        Raises TimeoutError after the call deadline, RuntimeError when the engine is gone.
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + self.deadline
        while True:
            if self.gone:
                raise RuntimeError(self.gone)
            if self.ready.is_set() and self.epoch > after_epoch:
                return self.epoch
            left = end - loop.time()
            if left <= 0:
                raise TimeoutError("the engine is restarting; retry later")
            self.poke()
            try:
                await asyncio.wait_for(self.ready.wait(), min(left, self.every))
            except asyncio.TimeoutError:
                pass
            if self.ready.is_set() and self.epoch <= after_epoch:
                await asyncio.sleep(min(left, 0.05))

    # ---- the loop ----------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.every)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self._check()
            except asyncio.CancelledError:
                raise
            except Exception:  # the watch must outlive a bad round
                log.exception("supervision round failed")
                self.ready.clear()
                await self._health(False, "supervision round failed")

    async def _check(self) -> None:
        try:
            c = await asyncio.wait_for(self.manager.hello.remote(), self.deadline)
        except ActorDiedError as e:  # killed for good (ray.kill, restarts used up)
            self.gone = f"the cache manager is gone for good: {_first_line(e)}"
            self.ready.clear()
            return await self._health(False, self.gone)
        except (RayActorError, asyncio.TimeoutError) as e:  # restarting, or stuck
            self.ready.clear()
            return await self._health(False, f"the cache manager is not answering ({e!r:.200})")
        if (c.incarnation, c.epoch) != (self._manager_known, self.manager_epoch):
            self.ready.clear()
            await self._health(False, "the cache manager restarted")
            await self._sync(rescan=True)
        hellos = await asyncio.gather(*(self._hello(m) for m in self.replicas))
        # The replicas the manager routes to: the front end may have reported one lost.
        try:
            routed = set(await asyncio.wait_for(self.manager.alive.remote(), self.deadline))
        except (RayActorError, asyncio.TimeoutError):  # the next round looks again
            routed = set(range(len(self.replicas)))
        dead = 0
        for r, h in enumerate(hellos):
            if isinstance(h, ActorDiedError):
                dead += 1
                await self._down(r, f"replica {r} is gone for good")
            elif isinstance(h, BaseException):
                await self._down(r, f"replica {r} is not answering ({_first_line(h)})")
            elif not h.loop_ok:
                self._missed[r] += 1
                await self._down(r, f"replica {r}'s loop missed its {self.loop_deadline} s ping")
                if self._missed[r] >= WEDGED_PINGS:
                    log.error("replica %d's model loop is wedged: restarting it", r)
                    self._missed[r] = 0
                    self.wedged_restarts += 1
                    ray.kill(self.replicas[r], no_restart=False)
            else:
                self._missed[r] = 0
                restarted = h.incarnation != self._known[r] or h.epoch < 0
                if restarted or not self._up[r] or r not in routed:
                    try:  # lost, then answering: reset like a restart
                        await self._revive(r)
                    except (RayActorError, asyncio.TimeoutError) as e:  # next round again
                        log.error("replica %d did not resynchronise: %s", r, _first_line(e))
        if dead == len(self.replicas):
            self.gone = "every model replica is gone for good"
        if any(self._up):
            self.ready.set()
            await self._health(True, "")
        else:
            self.ready.clear()
            await self._health(False, "no model replica answers")

    async def _hello(self, model):
        try:
            return await asyncio.wait_for(
                model.hello.remote(self.loop_deadline), self.loop_deadline + self.deadline
            )
        except (RayActorError, asyncio.TimeoutError) as e:
            return e

    async def _down(self, r: int, why: str) -> None:
        """Replica `r` does not serve: the manager stops routing to it and forgets its RAM."""
        if self._up[r]:
            log.error("%s: its RAM entries leave the index", why)
            self._up[r] = False
            await asyncio.wait_for(self.manager.lost.remote(r), self.deadline)

    async def _revive(self, r: int) -> None:
        """Replica `r` restarted (empty), or answers again after it was lost (holding what
        the manager forgot): it is reset in an epoch of its own (the manager is the same,
        so requests on other replicas stay valid; the plans placed on `r` before are
        refused there), then the manager reconciles its files and routes to it again."""
        self._up[r] = True  # _down tells the manager, once
        await self._down(r, f"replica {r} restarted or answers again")
        epoch = self.epoch + 1
        model = self.replicas[r]
        await asyncio.wait_for(
            model.resync.remote(
                epoch, self.manager, self.replicas, *self.limits, flush_timeout=self.deadline
            ),
            3 * self.deadline,
        )
        h = await asyncio.wait_for(model.hello.remote(self.loop_deadline), 2 * self.deadline)
        machine = await asyncio.wait_for(model.machine.remote(), self.deadline)
        revived = self.manager.revived.remote(r, restarted=True, epoch=epoch, machine=machine)
        await asyncio.wait_for(revived, self.deadline)
        self.epoch, self._known[r], self._up[r] = epoch, h.incarnation, True
        self._machines[r] = machine
        self.restarts += 1
        log.warning("epoch %d: replica %d is resynchronised", epoch, r)

    async def _sync(self, rescan: bool) -> None:
        """Begin a new epoch for everything: the replicas first (their old requests refused),
        then the manager rebuilt from disk above every id a replica held."""
        self.ready.clear()
        epoch = self.epoch + 1
        d = self.deadline
        c = await asyncio.wait_for(self.manager.hello.remote(), d)

        async def one(r: int):
            m = self.replicas[r]
            try:
                h = await asyncio.wait_for(m.hello.remote(self.loop_deadline), 2 * d)
                limits = (epoch, self.manager, self.replicas, *self.limits)
                max_id = await asyncio.wait_for(m.resync.remote(*limits, flush_timeout=d), 3 * d)
                self._machines[r] = await asyncio.wait_for(m.machine.remote(), d)
                return h.incarnation, max_id
            except (RayActorError, asyncio.TimeoutError) as e:
                log.error("replica %d did not resynchronise: %s", r, _first_line(e))
                return None, 0

        synced = await asyncio.gather(*(one(r) for r in range(len(self.replicas))))
        max_id = max(m for _, m in synced)
        lost = [r for r, (incarnation, _) in enumerate(synced) if incarnation is None]
        await asyncio.wait_for(self.manager.resync.remote(epoch, max_id + 1, rescan, lost), d)
        known = [m for m in self._machines if m]
        machines = [m or known[0] for m in self._machines] if known else None
        await asyncio.wait_for(self.manager.attach.remote(self.replicas, machines), d)
        for r, (incarnation, _) in enumerate(synced):
            self._known[r], self._up[r] = incarnation, incarnation is not None
        if self._manager_known is not None:
            self.restarts += 1
            log.warning("epoch %d: the actors are resynchronised", epoch)
        self.epoch, self._manager_known, self.manager_epoch = epoch, c.incarnation, epoch
        if any(self._up):
            self.ready.set()

    async def _health(self, up: bool, why: str) -> None:
        if up != self._healthy:
            if not up:
                log.error("health goes NOT_SERVING: %s", why)
            else:
                log.warning("health goes SERVING again (epoch %d)", self.epoch)
            self._healthy = up
            await self.set_health(up)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
