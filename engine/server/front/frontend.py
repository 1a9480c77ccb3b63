"""The front end's domain side: prompt, plan, run, stream. No gRPC types here.

It tokenizes and renders the chat template (engine.server.prompts.prompt), asks the cache
manager for a RestorePlan, submits the request to the model replica the plan
names and yields its events, which come on that replica's event stream
(engine.server.supervision.replica_events: a step's events of every request in one frame).
The model sends token ids: their text, the stop strings and the
log-probabilities' token text are one request's `Reply` (engine.server.front.reply),
and a stop string found tells the replica to stop. The
gRPC servicer (engine.server.rpc.service) and the in-process bridge only translate.

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
from typing import Mapping, Sequence

import numpy as np

from engine.actors.cache_manager import NotSynchronised
from engine.actors.handles import Handle, ManagerCalls, ModelCalls
from engine.cache.messages import PlanRequest, Release
from engine.config import EngineConfig
from engine.runtime.branches import branch_key
from engine.runtime.events import Finished, FinishReason, Tokens
from engine.runtime.requests import GenerationRequest, SamplingParams
from engine.runtime.structured.grammar import Grammar
from engine.server.errors import ActorGone, InvalidRequest, Overloaded, Unavailable
from engine.server.front.reply import Reply
from engine.server.observe.activity import Activity, Inspection, NamespaceTags, inspection
from engine.server.observe.cache_view import CacheView, cache_view, disk_view
from engine.server.prompts.prompt import PromptBuilder, PromptInput
from engine.server.supervision.replica_events import LOST, SILENT, ReplicaEvents
from engine.server.supervision.supervisor import Supervisor

log = logging.getLogger("lineage.request")


class _Restarted(Exception):
    """The replica died (`died`) or was reset under a request; retried if nothing streamed."""

    def __init__(self, message: str, died: bool):
        super().__init__(message)
        self.died = died


class _NoReplica(Exception):
    """The manager has no replica to place the request on."""


class Frontend:
    def __init__(
        self,
        models: Sequence[Handle[ModelCalls]],
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
        self.name = name  # the model's served name, in its request log lines
        self.models = list(models)  # by replica number (engine.actors.handles: what is called)
        self.manager = manager
        self.builder = builder
        self.info = info  # ModelInfo
        self.cache_mode = config.cache.mode
        self.supervisor = supervisor
        self.closing = asyncio.Event()
        self.max_queue = config.model.max_queue
        self.max_batch_tokens = config.model.max_batch_tokens
        self.limits = config.limits  # on what clients send (engine.server.security.limits)
        self.deadline = config.server.call_deadline
        self.stream_deadline = config.server.stream_deadline
        self.queued = 0  # requests holding a queue slot: taken at the first check
        self.retries = 0  # requests retried after a restart
        self.cancelling: dict = {}  # cancel task -> (namespace, prompt): a retry may wait on it
        self.in_flight: dict[str, tuple[str, np.ndarray]] = {}  # request_id -> (namespace, prompt)
        self.budgets = dict(budgets or {})  # tier -> bytes, for Inspect
        self.namespaces = namespaces or NamespaceTags()  # how namespaces show
        self.activity = Activity()
        self.metrics = metrics  # EngineMetrics, or None
        self.memory = memory  # the MemoryPlan the actors were given, for the cache page
        self.sessions: dict[str, str] = {}  # request id -> the session key it named
        # Every (namespace, id) from acceptance to the end of its stream -> the id inside.
        self.request_ids: dict[tuple[str, str], str] = {}
        self.internal_ids: set[str] = set()
        self.calls: set[asyncio.Task] = set()  # the tasks iterating generate(), for close()
        self.volatile: dict[str, int] = {}  # request id -> volatile lines removed (its log line)
        # Template rendering and tokenization run here, off the event loop; one
        # thread, so the builder's memo needs no lock.
        self.prompt_thread = concurrent.futures.ThreadPoolExecutor(1, "prompt-builder")
        ip = _node_ip()
        self.events = [
            ReplicaEvents(m, ip, lambda: self.stream_deadline, self.deadline) for m in self.models
        ]

    def close(self) -> None:
        """Shutting down: every call in flight ends UNAVAILABLE, no new one starts."""
        self.closing.set()
        for task in list(self.calls):
            task.cancel()  # generate() turns it into Unavailable
        for events in self.events:
            events.close()

    async def _await_superseded(
        self, namespace: str, tokens: np.ndarray, request_id: str = "", patience: float = 0.5
    ) -> None:
        """A prompt that extends an in-flight prompt is a retry of a dropped call.

        Its client has gone, but the server may not have seen the cancellation
        yet (it races the new call): wait briefly for it to land, then for its
        commit, so the retry restores what the dropped call computed. Only the
        cancels of prompts this one extends (or of its own request id) are waited for.
        """
        deadline = time.monotonic() + patience
        while _extends(tokens, namespace, self.in_flight.values()):
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.01)
        mine = [
            t
            for t, (ns, prompt, rid) in self.cancelling.items()
            if rid == request_id or _extends(tokens, namespace, [(ns, prompt)])
        ]
        if mine:
            await asyncio.wait(mine, timeout=2.0)

    def _cancel(self, model, request_id: str, namespace: str, tokens: np.ndarray) -> None:
        ref = model.cancel.remote(request_id)
        task = asyncio.ensure_future(self._await_ref(ref, self.deadline))
        self.cancelling[task] = (namespace, tokens, request_id)
        task.add_done_callback(lambda t: self.cancelling.pop(t, None))

    @staticmethod
    async def _await_ref(ref, deadline: float) -> None:
        try:
            await asyncio.wait_for(ref, deadline)
        except (ActorGone, asyncio.TimeoutError):  # a dead or stuck actor: nothing to wait for
            pass
        except Exception:  # anything else is a bug in the cancel path: say so
            log.exception("cancelling a request failed")

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
        key = (namespace, given)  # ids are unique per namespace: no tenant sees another's
        if key in self.request_ids:
            raise InvalidRequest(f"request_id {given!r} is already in flight")
        # Inside the engine an id names one request; one that another namespace has in
        # flight runs under a suffix no client id can have ('~').
        request_id = given if given not in self.internal_ids else f"{given}~{uuid.uuid4().hex}"
        self.request_ids[key] = request_id
        self.internal_ids.add(request_id)
        if session:
            self.sessions[request_id] = session
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
            del self.request_ids[key]
            self.internal_ids.discard(request_id)
            self.volatile.pop(request_id, None)
            self.sessions.pop(request_id, None)

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
                self.volatile[request_id] = prompt.volatile
            tokens = np.asarray(prompt.tokens, dtype=np.int32)
            await self._await_superseded(namespace, tokens, request_id)
            epoch = await self._ready(0)
            exclude: tuple[int, ...] = ()
            resets = attempts = 0
            while True:
                attempts += 1
                if attempts > len(self.models) + 2:
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
                    async for batch in self._run(req, streamed):
                        yield batch
                    return
                except _NoReplica as e:
                    if not exclude:
                        raise Unavailable(str(e)) from None
                    exclude = ()  # every replica failed this request: wait for a restart
                    epoch = await self._ready(epoch)
                    continue
                except _Restarted as e:
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

    async def _run(self, req: GenerationRequest, streamed: list):
        """The events of `req` on its replica, with their text; _Restarted when the replica
        went away or was reset under it. Tells the manager when its prefill ended."""
        model = self.models[req.plan.replica]
        events = self.events[req.plan.replica]
        rid = req.request_id
        finished = prefilled = False
        self.in_flight[rid] = (req.namespace, np.asarray(req.tokens, dtype=np.int32))
        queue = events.register(rid)
        # One text per branch (SamplingParams.n); the request ends with its n-th Finished.
        reply = Reply(
            self.builder.tokenizer,
            req.sampling,
            req.grammar is not None,
            lambda index: model.stop.remote(branch_key(rid, index)),
        )
        completion = 0  # over the branches: one request, however many it ran (n)
        try:
            await self._submit(model, events, req)
            while not finished:
                batch = await queue.get()
                if isinstance(batch, str):
                    self._ended(batch, req)
                out = []
                for event in batch:
                    if isinstance(event, Tokens):
                        event = reply.tokens(event)
                        if event is None:
                            continue
                    elif isinstance(event, Finished):
                        finished = reply.end()
                        if event.finish_reason == FinishReason.UNAVAILABLE:
                            self._poke()
                            raise _Restarted(event.error, False)
                        *tail, event = reply.finish(event)
                        out += tail
                        completion += event.completion_tokens
                        if finished:  # counted once, with every branch's tokens
                            whole = dataclasses.replace(event, completion_tokens=completion)
                            self._finished(whole, req)
                    if not prefilled and isinstance(event, (Tokens, Finished)):
                        prefilled = True
                        self.manager.prefilled.remote(rid)
                    out.append(event)
                if any(isinstance(e, Tokens) for e in out):
                    streamed[:] = [True]
                if out:
                    yield out
        finally:
            events.unregister(rid)
            if not prefilled:
                self.manager.prefilled.remote(rid)
            if not finished:
                self._cancel(model, rid, *self.in_flight[rid])
            self.in_flight.pop(rid, None)

    async def _submit(self, model, events: ReplicaEvents, req: GenerationRequest):
        """Hand the request to its replica (connecting to its event stream first)."""
        try:
            stream = await events.connect()
            refused = await asyncio.wait_for(model.submit.remote(req, stream), self.deadline)
        except ActorGone as e:
            self._poke()
            raise _Restarted(f"model replica {req.plan.replica} died ({e!r:.200})", True)
        except (asyncio.TimeoutError, OSError) as e:
            self._poke()
            raise Unavailable(f"model replica {req.plan.replica} did not answer ({e!r:.200})")
        if refused:  # planned in another epoch of the replica's, or a former incarnation's stream
            self._poke()
            raise _Restarted(refused, False)

    def _ended(self, signal: str, req: GenerationRequest) -> None:
        """A request's stream ended without its final event: say why, as the caller expects."""
        self._poke()
        if signal == LOST:
            raise _Restarted("the model stream ended without a final event", True)
        assert signal == SILENT, signal
        raise Unavailable(f"the model sent nothing for {self.stream_deadline:.0f} s")

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
        )
        planning = asyncio.ensure_future(_resolve(self.manager.plan.remote(request)))
        try:
            plan = await asyncio.wait_for(asyncio.shield(planning), self.deadline)
        except BaseException as e:
            planning.add_done_callback(lambda t: self._release_plan(t, request_id))
            if isinstance(e, asyncio.TimeoutError):
                self._poke()
                raise Unavailable(f"the cache manager did not plan within {self.deadline:.0f} s")
            if isinstance(e, (ActorGone, NotSynchronised)):  # restarted: wait for its resync
                self._poke()
                raise _Restarted(f"the cache manager is unavailable ({type(e).__name__})", False)
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

    def _release_plan(self, planning: asyncio.Future, request_id: str) -> None:
        """A plan nobody runs: its replica releases it (its Orders belong there)."""
        if planning.cancelled() or planning.exception() is not None:
            return
        model = self.models[planning.result().replica]
        asyncio.ensure_future(self._await_ref(model.release.remote(request_id), self.deadline))

    def _finished(self, f: Finished, req: GenerationRequest) -> None:
        """Log the request, keep its record, count it."""
        volatile = self.volatile.get(req.request_id, 0)
        session = self.sessions.get(req.request_id, "")
        log_request(
            f, req.plan.captures, req.plan.miss, volatile, self.name, session, req.namespace
        )
        tag = self.namespaces.tag(req.namespace)
        owner = (req.namespace, session)
        self.activity.record(f, tag, miss=req.plan.miss, owner=owner)
        if self.metrics is not None:
            self.metrics.request(f, tag, req.plan.captures, req.plan.length)

    def error(self, code: str) -> None:
        """A call ended with gRPC status `code` (counted for the metrics)."""
        if self.metrics is not None:
            self.metrics.error(code)

    async def inspect(self, recent: int = 20) -> Inspection:
        """Live figures: the cache, each replica, the recent window, the latest requests."""
        cache, anchors, *tiers = await asyncio.gather(
            self.manager.stats.remote(),
            self.manager.anchors.remote(),
            *(m.tier_stats.remote() for m in self.models),
            return_exceptions=True,
        )
        for value in (cache, anchors):
            if isinstance(value, BaseException):
                raise value
        live = {str(i): t for i, t in enumerate(tiers) if not isinstance(t, BaseException)}
        return inspection(
            cache, anchors, live, self.budgets, self.activity, self.namespaces, recent
        )

    async def cache_view(
        self, scope: str | None, recent: int = 50, operator: bool = True
    ) -> CacheView:
        """The cache page's figures for namespace `scope` (None: the whole cache); the
        memory plan for the `operator` alone."""
        try:
            tree = await asyncio.wait_for(self.manager.tree.remote(scope), self.deadline)
        except asyncio.TimeoutError:
            raise Unavailable(f"the cache manager did not answer within {self.deadline:.0f} s")
        if not operator:
            return cache_view(tree, self.activity, scope, recent)
        try:  # the disk tier's state: the operator's alone (it is the whole cache's)
            disk = disk_view(await asyncio.wait_for(self.inspect(0), self.deadline))
        except Exception as e:  # a replica restarting, the manager busy: the page still shows
            log.warning("cache page: the disk tier's state not read (%s)", e)
            disk = None
        return cache_view(tree, self.activity, scope, recent, self.memory, disk)

    async def stats(self):
        try:
            return await asyncio.wait_for(self.manager.stats.remote(), self.deadline)
        except asyncio.TimeoutError:
            raise Unavailable(f"the cache manager did not answer within {self.deadline:.0f} s")


async def _resolve(ref):
    return await ref


def _node_ip() -> str:
    """This process's node address as Ray knows it (replicas on it listen on the loopback)."""
    import ray

    return ray.util.get_node_ip_address()


def _extends(tokens: np.ndarray, namespace: str, prompts) -> bool:
    """Whether `tokens` extends (or equals) one of the (namespace, prompt) pairs."""
    for ns, prompt in prompts:
        n = len(prompt)
        if ns == namespace and n <= len(tokens) and np.array_equal(tokens[:n], prompt):
            return True
    return False


def _as_given(event, request_id: str):
    """A Finished event under the id its client gave."""
    if isinstance(event, Finished):
        return dataclasses.replace(event, request_id=request_id)
    return event


def _clip_max_tokens(s: SamplingParams, room: int) -> SamplingParams:
    from dataclasses import replace

    return replace(s, max_tokens=max(1, room))


def log_request(
    f: Finished,
    captures,
    miss=None,
    volatile: int = 0,
    model: str = "",
    session=None,
    namespace: str = "",
) -> None:
    """One key=value line per request (the cost of each turn is visible in the log).

    `miss`: why it restored less than an earlier prompt offered (`kind@token/m<message>`);
    `volatile`: system-prompt lines the volatile-line rules removed; `model`: the model's
    served name (the directory's, with one model); `session`: the conversation's key
    (x-session-id, prompt_cache_key, ...), which names the turns of one conversation
    beside its misses; `namespace`: the cache namespace it ran in (after the token
    placed it under its tenant's).
    """
    timing = " ".join(
        f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
        for k, v in dataclasses.asdict(f.timing).items()
    )
    log.info(
        "request id=%s model=%s replica=%s finish=%s prompt=%d cached=%d completion=%d "
        "restore=%s@%d lost=%s captures=%s miss=%s volatile=%d namespace=%s session=%s %s",
        f.request_id,
        model or "-",
        f.replica or "-",
        f.finish_reason,
        f.prompt_tokens,
        f.cached_tokens,
        f.completion_tokens,
        f.restore_kind,
        f.restore_length,
        f.restore_lost or "-",
        ",".join(f"{c.kind}@{c.length}" for c in captures) or "-",
        miss or "-",
        volatile,
        namespace or "-",
        session or "-",
        timing,
    )
