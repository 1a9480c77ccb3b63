"""The front end's domain side: a request's road from prompt to plan, run and stream.

`Frontend.generate` accepts a request (its id and session: engine.server.front.in_flight),
tokenizes and renders the chat template off the event loop
(engine.server.prompts.prompt), asks the cache manager for a RestorePlan and
streams the run on the replica the plan names (engine.server.front.run); what
it shows (the request log, records, metrics, live figures) is
engine.server.front.inspection's. The gRPC servicer (engine.server.rpc.service)
and the in-process bridge only translate; no gRPC types here.

Admission: a queue slot is taken at the first check (`max_queue`), a request
that alone needs more tokens than the batch holds (`max_batch_tokens`) is
refused; both as Overloaded. Every actor call and every silence of a stream
has a deadline. Requests wait while the supervisor resynchronises the actors.
A request whose replica died before it streamed a token runs again on
another replica (or, with none left, once more after the restart); one whose
replica was reset under it runs once more in the next epoch; after a token,
the stream ends UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
import uuid
from functools import partial
from typing import Mapping, Sequence

import numpy as np

from engine.actors.cache_manager import NotSynchronised
from engine.actors.handles import Handle, ManagerCalls, ModelCalls
from engine.cache.messages import PlanRequest, Release
from engine.config import EngineConfig
from engine.runtime.events import Finished
from engine.runtime.requests import GenerationRequest, SamplingParams
from engine.runtime.structured.grammar import Grammar
from engine.server.errors import ActorGone, Overloaded, Unavailable
from engine.server.front.in_flight import InFlight, await_ref
from engine.server.front.inspection import Inspector
from engine.server.front.run import Deadlines, Restarted, Runs
from engine.server.observe.activity import Inspection, NamespaceTags
from engine.server.observe.cache_view import CacheView
from engine.server.prompts.prompt import PromptBuilder, PromptInput
from engine.server.supervision.replica_events import ReplicaEvents
from engine.server.supervision.supervisor import Supervisor

log = logging.getLogger("lineage.request")
FIRST = asyncio.FIRST_COMPLETED


# A request told to wait for one in flight (RestorePlan.after) waits `--flight-wait`
# seconds at most (0: it is never told to wait), then runs without that flight's capture.
# When it extends that flight's prompt whole, it asks the flight's replica to store the
# prompt end early (RestorePlan.after_entry) and is woken once it is indexed, or once the
# flight's commit or release is answered; otherwise (a capture point, or the flight not on
# its replica yet) it asks the manager again every FLIGHT_POLL_S. The manager stops
# answering "wait" the moment the flight's prompt end is indexed, or the flight commits, is
# released or its replica is forgotten, so the bound is only a safety net.
FLIGHT_POLL_S = 0.02


class _NoReplica(Exception):
    """The manager has no replica to place the request on."""


class Frontend:
    """Requests from acceptance to their last event: admission, plan, retries."""

    def __init__(
        self,
        replicas: Sequence[Handle[ModelCalls]],
        manager: Handle[ManagerCalls],
        builder: PromptBuilder,
        info,
        config: EngineConfig,
        supervisor: Supervisor | None = None,
        budgets: Mapping[str, int] | None = None,
        namespaces: NamespaceTags | None = None,
        metrics=None,
        name: str = "",
        memory=None,
    ):
        self.replicas = list(replicas)  # by replica number (engine.actors.handles: what is called)
        self.manager = manager
        self.builder = builder
        self.info = info  # ModelInfo
        self.cache_mode = config.cache.mode
        self.supervisor = supervisor
        self.closing = asyncio.Event()
        self.max_queue = config.model.max_queue
        self.max_batch_tokens = config.model.max_batch_tokens
        self.limits = config.limits  # on what clients send (engine.server.security.limits)
        self.deadlines = Deadlines(config.server.call_deadline, config.server.stream_deadline)
        self.flight_wait = config.server.flight_wait  # seconds; 0: plans never wait
        self.queued = 0  # requests holding a queue slot: taken at the first check
        self.retries = 0  # requests retried after a restart
        self.flight = InFlight()  # ids, sessions, prompts and cancels of the requests in flight
        self.inspector = Inspector(
            self.replicas, manager, name, budgets, namespaces, metrics, memory
        )
        self.activity = self.inspector.activity  # shown by Inspect and the cache page
        self.metrics = metrics  # EngineMetrics, or None
        self.namespaces = self.inspector.namespaces
        self.calls: set[asyncio.Task] = set()  # the tasks iterating generate(), for close()
        # Template rendering and tokenization run here, off the event loop; one
        # thread, so the builder's memo needs no lock.
        self.prompt_thread = concurrent.futures.ThreadPoolExecutor(1, "prompt-builder")
        ip = _node_ip()
        self.events = [
            ReplicaEvents(m, ip, lambda: self.deadlines.stream, self.deadlines.call)
            for m in self.replicas
        ]
        self.runs = Runs(
            self.replicas,
            self.events,
            manager,
            builder.tokenizer,
            self.flight,
            self.inspector,
            self.deadlines,
            self._poke,
        )

    @property
    def deadline(self) -> float:
        """Seconds an actor call may take."""
        return self.deadlines.call

    @deadline.setter
    def deadline(self, seconds: float) -> None:
        self.deadlines.call = seconds

    @property
    def stream_deadline(self) -> float:
        """Seconds a replica's stream may stay silent."""
        return self.deadlines.stream

    @stream_deadline.setter
    def stream_deadline(self, seconds: float) -> None:
        self.deadlines.stream = seconds

    def close(self) -> None:
        """Shutting down: every call in flight ends UNAVAILABLE, no new one starts."""
        self.closing.set()
        for task in list(self.calls):
            task.cancel()  # generate() turns it into Unavailable
        for events in self.events:
            events.close()

    async def generate(
        self,
        inp: PromptInput,
        sampling: SamplingParams,
        namespace: str = "",
        request_id: str = "",
        session: str = "",
        grammar: Grammar | None = None,
    ):
        """Yield lists of events (Progress, Tokens, Finished) for one request; `grammar`
        holds its output (engine.server.prompts.constraints built it from the wire's constraint).

        Raises Overloaded when the queue is full (the slot is taken at this first
        check, so a burst cannot slip past it) or when the request alone needs more
        tokens than the batch holds; Unavailable when the engine cannot serve. A
        request the model actor lost before it streamed a token is run once more,
        after the actors are resynchronised.
        """
        if self.closing.is_set():
            raise Unavailable("the server is shutting down")
        received = time.time()
        given = request_id or uuid.uuid4().hex
        request_id = self.flight.accept(namespace, given, session)
        events = self._generate(inp, sampling, namespace, request_id, received, session, grammar)
        task = asyncio.current_task()
        self.calls.add(task)
        try:
            async for batch in events:
                yield batch if request_id == given else [_as_given(e, given) for e in batch]
        except asyncio.CancelledError:
            if self.closing.is_set():
                raise Unavailable("the server is shutting down") from None
            raise
        finally:
            self.calls.discard(task)
            await events.aclose()  # its cleanup (the cancel) runs now, not when collected
            self.flight.done(namespace, given, request_id)

    async def _generate(
        self,
        inp,
        sampling,
        namespace: str,
        request_id: str,
        received: float,
        session: str = "",
        grammar: Grammar | None = None,
    ):
        if self.queued >= self.max_queue:
            raise Overloaded(
                f"{self.queued} requests are in flight (the limit is {self.max_queue}); retry later"
            )
        self.queued += 1
        try:
            prompt, sampling = await self._prepare(inp, sampling)
            if prompt.volatile:
                self.flight.volatile[request_id] = prompt.volatile
            tokens = np.asarray(prompt.tokens, dtype=np.int32)
            await self.flight.superseded(namespace, tokens, request_id)
            epoch = await self._ready(0)
            exclude: tuple[int, ...] = ()
            resets = attempts = 0
            while True:
                attempts += 1
                if attempts > len(self.replicas) + 2:
                    raise Unavailable("the engine kept restarting under this request")
                streamed: list = []  # becomes [True] once a token went to the client
                try:
                    req = None
                    req = await self._plan(
                        request_id,
                        namespace,
                        prompt,
                        tokens,
                        sampling,
                        received,
                        exclude,
                        session,
                        grammar,
                    )
                    async for batch in self.runs.stream(req, streamed):
                        yield batch
                    return
                except _NoReplica as e:
                    if not exclude:
                        raise Unavailable(str(e)) from None
                    exclude = ()  # every replica failed this request: wait for a restart
                    epoch = await self._ready(epoch)
                    continue
                except Restarted as e:
                    # The manager forgets the request (and the dead replica's RAM) first.
                    if req is not None:
                        await self._replica_gone(req.plan.replica if e.died else None, request_id)
                    if streamed:
                        raise Unavailable(f"the engine restarted under this request: {e}")
                    self.retries += 1
                    log.warning("request %s: %s; running it again", request_id, e)
                    if e.died:
                        exclude = (*exclude, req.plan.replica)
                    else:
                        resets += 1
                        if resets > 1:
                            raise Unavailable(f"the engine restarted under this request: {e}")
                        epoch = await self._ready(epoch)
        finally:
            self.queued -= 1

    async def _ready(self, after_epoch: int) -> int:
        """The current epoch (a later one than `after_epoch` after a failure)."""
        if self.supervisor is None:
            return 0
        try:
            return await self.supervisor.wait_ready(after_epoch)
        except (TimeoutError, RuntimeError) as e:
            raise Unavailable(str(e))

    async def _replica_gone(self, replica: int | None, request_id: str) -> None:
        """Tell the manager: this request ended (and the replica's RAM is gone, if given)."""
        try:
            if replica is not None:
                await asyncio.wait_for(self.manager.lost.remote(replica), self.deadline)
            release = self.manager.release.remote(Release(request_id=request_id), None)
            await asyncio.wait_for(release, self.deadline)
        except (ActorGone, asyncio.TimeoutError):
            log.exception("the cache manager is gone too")

    def _poke(self) -> None:
        if self.supervisor is not None:
            self.supervisor.poke()

    async def _prepare(self, inp: PromptInput, sampling: SamplingParams):
        """(prompt, sampling) built (its values were checked: service.check_request);
        max_tokens clipped to the context left, the whole held to the batch's room."""
        loop = asyncio.get_running_loop()
        prompt = await loop.run_in_executor(self.prompt_thread, self.builder.build, inp)
        if len(prompt.tokens) + sampling.max_tokens > self.info.max_context:
            sampling = _clip_max_tokens(sampling, self.info.max_context - len(prompt.tokens))
        need = (len(prompt.tokens) + sampling.max_tokens) * sampling.n  # each branch holds both
        if self.max_batch_tokens is not None and need > self.max_batch_tokens:
            raise Overloaded(
                f"the prompt and max_tokens need {need} tokens (times n={sampling.n}); the batch "
                f"holds at most {self.max_batch_tokens} (--max-batch-tokens): shorten the prompt "
                "or max_tokens, or ask fewer branches"
            )
        return prompt, sampling

    async def _plan(
        self,
        request_id: str,
        namespace: str,
        prompt,
        tokens,
        sampling,
        received: float,
        exclude=(),
        session: str = "",
        grammar: Grammar | None = None,
    ) -> GenerationRequest:
        """Ask the cache manager for the restore plan; the request the model actor runs.

        A plan that comes back after its caller was cancelled or gave up (deadline)
        is released through the model actor, so its pin and ids are not leaked.
        """
        t0 = time.perf_counter()
        request = PlanRequest(
            request_id=request_id,
            tokens=tokens,
            anchor_len=prompt.anchor_len,
            namespace=namespace,
            exclude=tuple(exclude),
            session=session,
            layout=prompt.layout,
            may_wait=self.flight_wait > 0,
        )
        gave_up = asyncio.Event()
        planning = asyncio.ensure_future(self._planned(request, gave_up))
        try:
            waiting = self.deadline + self.flight_wait
            plan = await asyncio.wait_for(asyncio.shield(planning), waiting)
        except BaseException as e:
            gave_up.set()  # a wait for a flight ends at its next look: planned, then released
            planning.add_done_callback(lambda t: self._release_plan(t, request_id))
            if isinstance(e, asyncio.TimeoutError):
                self._poke()
                raise Unavailable(f"the cache manager did not plan within {self.deadline:.0f} s")
            if isinstance(e, (ActorGone, NotSynchronised)):  # restarted: wait for its resync
                self._poke()
                raise Restarted(f"the cache manager is unavailable ({type(e).__name__})", False)
            if isinstance(e, LookupError):  # no replica alive
                raise _NoReplica(str(e)) from None
            raise
        return GenerationRequest(
            request_id=request_id,
            namespace=namespace,
            tokens=prompt.tokens,
            plan=plan,
            sampling=sampling,
            received_at=received,
            plan_ms=(time.perf_counter() - t0) * 1000,
            grammar=grammar,
        )

    async def _planned(self, request: PlanRequest, gave_up: asyncio.Event):
        """The manager's plan. An answer to wait for a request in flight (RestorePlan.after:
        its capture would restore much of this prompt) waits for that flight's prompt end
        (`_woken`) or asks again every FLIGHT_POLL_S; past its wait bound (`--flight-wait`)
        or once its caller gave up, it is planned at once (may_wait off). Each call has the
        call deadline."""
        bound, rid = time.monotonic() + self.flight_wait, request.request_id
        woke = False  # the last wait was woken: a second "wait" in a row polls once first
        while True:
            asked = asyncio.ensure_future(_resolve(self.manager.plan.remote(request)))
            try:
                plan = await asyncio.wait_for(asyncio.shield(asked), self.deadline)
            except BaseException:  # a plan answered late is released, as the caller's is
                asked.add_done_callback(partial(self._release_plan, request_id=rid))
                raise
            if not plan.after:
                return plan
            ask = plan.after_entry is not None and not woke
            woke = ask and await self._woken(plan, bound - time.monotonic(), gave_up)
            if not woke:
                await asyncio.sleep(FLIGHT_POLL_S)
            if gave_up.is_set() or time.monotonic() >= bound:
                request = dataclasses.replace(request, may_wait=False)

    async def _woken(self, plan, wait: float, gave_up: asyncio.Event) -> bool:
        """Ask the replica of the flight `plan` waits for to store its prompt end early
        (ModelCalls.prompt_end), and wait until it is indexed or the flight is over: True
        then. False when the replica does not run that flight (yet), cannot be reached, or
        the wait ran out; the caller giving up ends it at once. Nothing is pinned meanwhile."""
        if wait <= 0 or gave_up.is_set() or not 0 <= plan.replica < len(self.replicas):
            return False
        ref = self.replicas[plan.replica].prompt_end.remote(plan.after, plan.after_entry, wait)
        asked = asyncio.ensure_future(_resolve(ref))
        given_up = asyncio.ensure_future(gave_up.wait())
        try:
            await asyncio.wait({asked, given_up}, timeout=wait + self.deadline, return_when=FIRST)
        finally:
            given_up.cancel()
        if not asked.done():
            asked.cancel()
            _cancel(ref)  # the replica takes the ask back
            return False
        if asked.cancelled() or asked.exception() is not None:
            return False
        return asked.result() in ("stored", "ended")

    def _release_plan(self, planning: asyncio.Future, request_id: str) -> None:
        """A plan nobody runs: its replica releases it (its Orders belong there)."""
        if planning.cancelled() or planning.exception() is not None:
            return
        replica = self.replicas[planning.result().replica]
        asyncio.ensure_future(await_ref(replica.release.remote(request_id), self.deadline))

    def error(self, code: str) -> None:
        """A call ended with gRPC status `code` (counted for the metrics)."""
        self.inspector.error(code)

    async def inspect(self, recent: int = 20) -> Inspection:
        """Live figures: the cache, each replica, the recent window, the latest requests."""
        return await self.inspector.inspect(recent)

    async def cache_view(
        self, scope: str | None, recent: int = 50, operator: bool = True
    ) -> CacheView:
        """The cache page's figures for namespace `scope` (None: the whole cache)."""
        return await self.inspector.cache_view(scope, self.deadline, recent, operator)

    async def stats(self):
        return await self.inspector.stats(self.deadline)


async def _resolve(ref):
    return await ref


def _cancel(ref) -> None:
    """Cancel a Ray call still running (a replica gone meanwhile: nothing to cancel)."""
    import ray

    try:
        ray.cancel(ref)
    except Exception:  # noqa: BLE001 - the call ended or its actor is gone: nothing runs
        pass


def _node_ip() -> str:
    """This process's node address as Ray knows it (replicas on it listen on the loopback)."""
    import ray

    return ray.util.get_node_ip_address()


def _as_given(event, request_id: str):
    """A Finished event under the id its client gave."""
    if isinstance(event, Finished):
        return dataclasses.replace(event, request_id=request_id)
    return event


def _clip_max_tokens(s: SamplingParams, room: int) -> SamplingParams:
    from dataclasses import replace

    return replace(s, max_tokens=max(1, room))
