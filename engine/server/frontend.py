"""The front end's domain side: prompt, plan, run, stream. No gRPC types here.

It tokenizes and renders the chat template (engine.server.prompt), asks the cache
manager for a RestorePlan, runs the request on the model replica the plan
names through a Ray streaming generator and yields the actor's events. When
that replica dies before the request streamed a token, it tells the manager
and runs the request again on another replica; after a token, the stream ends
UNAVAILABLE. The gRPC servicer (engine.server.service) only translates.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
import uuid
from typing import Mapping

import numpy as np

from engine.cache.messages import PlanRequest, Release
from engine.runtime.events import Finished, Tokens
from engine.runtime.requests import GenerationRequest, SamplingParams
from engine.server.activity import Activity, Inspection, inspection, namespace_tag
from engine.server.errors import ActorGone, InvalidRequest, Overloaded, Unavailable
from engine.server.limits import check_sampling
from engine.server.prompt import PromptBuilder, PromptInput

log = logging.getLogger("lineage.request")


class Frontend:
    def __init__(
        self,
        models,
        manager,
        builder: PromptBuilder,
        info,
        cache_mode: str,
        max_queue: int = 256,
        budgets: Mapping[str, int] | None = None,
        namespaces: str = "hash",
        metrics=None,
    ):
        self.models = list(models)  # ModelActor handles, by replica number
        self.manager = manager  # CacheManagerActor handle
        self.builder = builder
        self.info = info  # ModelInfo
        self.cache_mode = cache_mode
        self.closing = asyncio.Event()
        self.max_queue = max_queue
        self.cancelling: set = set()  # cancels whose commit a retry should see
        self.in_flight: dict[str, tuple[str, np.ndarray]] = {}  # request_id -> (namespace, prompt)
        self.budgets = dict(budgets or {})  # tier -> bytes, for Inspect
        self.namespaces = namespaces  # how namespaces show (activity.namespace_tag)
        self.activity = Activity()
        self.metrics = metrics  # EngineMetrics, or None
        self.request_ids: set[str] = set()  # every id from acceptance to the end of its stream
        # Template rendering and tokenization run here, off the event loop; one
        # thread, so the builder's memo needs no lock.
        self.prompt_thread = concurrent.futures.ThreadPoolExecutor(1, "prompt-builder")

    async def _await_superseded(
        self, namespace: str, tokens: np.ndarray, patience: float = 0.5
    ) -> None:
        """A prompt that extends an in-flight prompt is a retry of a dropped call.

        Its client has gone, but the server may not have seen the cancellation
        yet (it races the new call): wait briefly for it to land, then for its
        commit, so the retry restores what the dropped call computed.
        """

        def superseded() -> bool:
            for ns, prompt in self.in_flight.values():
                n = len(prompt)
                if ns == namespace and n <= len(tokens) and np.array_equal(tokens[:n], prompt):
                    return True
            return False

        deadline = time.monotonic() + patience
        while superseded() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self._settle_cancels()

    async def _settle_cancels(self, timeout: float = 2.0) -> None:
        """Wait (briefly) for cancelled requests to commit, so a retry can restore them."""
        if self.cancelling:
            await asyncio.wait(set(self.cancelling), timeout=timeout)

    def _cancel(self, model, request_id: str) -> None:
        task = asyncio.ensure_future(self._await_ref(model.cancel.remote(request_id)))
        self.cancelling.add(task)
        task.add_done_callback(self.cancelling.discard)

    @staticmethod
    async def _await_ref(ref) -> None:
        try:
            await ref
        except ActorGone:  # a dead actor: nothing to wait for
            pass
        except Exception:  # anything else is a bug in the cancel path: say so
            log.exception("cancelling a request failed")

    async def generate(
        self, inp: PromptInput, sampling: SamplingParams, namespace: str = "", request_id: str = ""
    ):
        """Yield lists of events (Progress, Tokens, Finished) for one request."""
        if self.closing.is_set():
            raise Unavailable("the server is shutting down")
        received = time.time()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.request_ids:
            raise InvalidRequest(f"request_id {request_id!r} is already in flight")
        self.request_ids.add(request_id)
        events = self._generate(inp, sampling, namespace, request_id, received)
        try:
            async for batch in events:
                yield batch
        finally:
            await events.aclose()  # its cleanup (the cancel) runs now, not when collected
            self.request_ids.discard(request_id)

    async def _generate(self, inp, sampling, namespace: str, request_id: str, received: float):
        prompt, sampling = await self._prepare(inp, sampling)
        if len(self.in_flight) >= self.max_queue:
            raise Overloaded(
                f"{len(self.in_flight)} requests are in flight (the limit is {self.max_queue}); "
                "retry later"
            )
        tokens = np.asarray(prompt.tokens, dtype=np.int32)
        await self._await_superseded(namespace, tokens)
        self.in_flight[request_id] = (namespace, tokens)
        exclude: tuple[int, ...] = ()
        try:
            while True:
                req = await self._plan(
                    request_id, namespace, prompt, tokens, sampling, received, exclude
                )
                replica = req.plan.replica
                streamed = []  # becomes [True] once a token went to the client
                try:
                    async for batch in self._run(self.models[replica], req, streamed):
                        yield batch
                    return
                except ActorGone as e:
                    await self._replica_gone(replica, request_id)
                    if streamed or len(exclude) + 1 >= len(self.models):
                        raise Unavailable(f"model replica {replica} died: {e}") from None
                    log.warning("replica %d died before %s streamed: retrying", replica, request_id)
                    exclude = (*exclude, replica)
        finally:
            self.in_flight.pop(request_id, None)

    async def _run(self, model, req: GenerationRequest, streamed: list):
        """The events of `req` on one replica; tells the manager when its prefill ended."""
        finished = prefilled = False
        try:
            async for ref in model.generate.options(num_returns="streaming").remote(req):
                batch = await ref
                for event in batch:
                    if isinstance(event, Finished):
                        finished = True
                        self._finished(event, req)
                    if not prefilled and isinstance(event, (Tokens, Finished)):
                        prefilled = True
                        self.manager.prefilled.remote(req.request_id)
                if any(isinstance(e, Tokens) for e in batch):
                    streamed[:] = [True]
                yield batch
        finally:
            if not prefilled:
                self.manager.prefilled.remote(req.request_id)
            if not finished:
                self._cancel(model, req.request_id)

    async def _replica_gone(self, replica: int, request_id: str) -> None:
        """Tell the manager: the replica's RAM is gone, and this request ended there."""
        try:
            await self.manager.lost.remote(replica)
            await self.manager.release.remote(Release(request_id=request_id), None)
        except ActorGone:
            log.exception("the cache manager is gone too")

    async def _prepare(self, inp: PromptInput, sampling: SamplingParams):
        """(prompt, sampling) checked and built; max_tokens clipped to the context left."""
        check_sampling(sampling, self.info.vocab_size)
        loop = asyncio.get_running_loop()
        prompt = await loop.run_in_executor(self.prompt_thread, self.builder.build, inp)
        if len(prompt.tokens) + sampling.max_tokens > self.info.max_context:
            sampling = _clip_max_tokens(sampling, self.info.max_context - len(prompt.tokens))
        return prompt, sampling

    async def _plan(
        self, request_id: str, namespace: str, prompt, tokens, sampling, received: float, exclude=()
    ) -> GenerationRequest:
        """Ask the cache manager for the restore plan; the request its replica runs."""
        t0 = time.perf_counter()
        try:
            plan = await self.manager.plan.remote(
                PlanRequest(
                    request_id=request_id,
                    tokens=tokens,
                    anchor_len=prompt.anchor_len,
                    namespace=namespace,
                    exclude=tuple(exclude),
                )
            )
        except LookupError as e:  # no replica alive
            raise Unavailable(str(e)) from None
        return GenerationRequest(
            request_id=request_id,
            namespace=namespace,
            tokens=prompt.tokens,
            plan=plan,
            sampling=sampling,
            received_at=received,
            plan_ms=(time.perf_counter() - t0) * 1000,
        )

    def _finished(self, f: Finished, req: GenerationRequest) -> None:
        """Log the request, keep its record, count it."""
        log_request(f, req.plan.captures)
        tag = namespace_tag(req.namespace, self.namespaces)
        self.activity.record(f, tag)
        if self.metrics is not None:
            self.metrics.request(f, tag, req.plan.captures, req.plan.length)

    def error(self, code: str) -> None:
        """A call ended with gRPC status `code` (counted for the metrics)."""
        if self.metrics is not None:
            self.metrics.error(code)

    async def stats(self):
        return await self.manager.stats.remote()

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


def _clip_max_tokens(s: SamplingParams, room: int) -> SamplingParams:
    from dataclasses import replace

    return replace(s, max_tokens=max(1, room))


def log_request(f: Finished, captures) -> None:
    """One key=value line per request (the cost of each turn is visible in the log)."""
    timing = " ".join(
        f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
        for k, v in dataclasses.asdict(f.timing).items()
    )
    log.info(
        "request id=%s replica=%s finish=%s prompt=%d cached=%d completion=%d "
        "restore=%s@%d lost=%s captures=%s %s",
        f.request_id,
        f.replica or "-",
        f.finish_reason,
        f.prompt_tokens,
        f.cached_tokens,
        f.completion_tokens,
        f.restore_kind,
        f.restore_length,
        f.restore_lost or "-",
        ",".join(f"{c.kind}@{c.length}" for c in captures) or "-",
        timing,
    )
