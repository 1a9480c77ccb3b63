"""What the front end shows of its requests and the cache: the request log, the record of
each request, the metrics, and the live figures (`lineage top`, the cache page).

`Inspector.finished` logs a request's line (`log_request`), keeps its record
(engine.server.observe.activity) and counts it; `inspect`, `cache_view` and
`stats` ask the cache manager and the replicas for their figures. It knows the
actors' calls and the observe package; nothing of a request's run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Mapping, Sequence

from engine.actors.handles import Handle, ManagerCalls, ModelCalls
from engine.runtime.events import Finished
from engine.runtime.requests import GenerationRequest
from engine.server.errors import ActorGone, Unavailable
from engine.server.observe.activity import Activity, Inspection, NamespaceTags, inspection
from engine.server.observe.cache_view import CacheView, cache_view, disk_view

log = logging.getLogger("lineage.request")


class Inspector:
    """The front end's records and figures: each request's, the cache's, the replicas'."""

    def __init__(
        self,
        replicas: Sequence[Handle[ModelCalls]],
        manager: Handle[ManagerCalls],
        name: str = "",
        budgets: Mapping[str, int] | None = None,
        namespaces: NamespaceTags | None = None,
        metrics=None,
        memory=None,
    ):
        self.replicas, self.manager = replicas, manager
        self.name = name  # the model's served name, in its request log lines
        self.budgets = dict(budgets or {})  # tier -> bytes, for Inspect
        self.namespaces = namespaces or NamespaceTags()  # how namespaces show
        self.activity = Activity()
        self.metrics = metrics  # EngineMetrics, or None
        self.memory = memory  # the MemoryShares the actors were given, for the cache page

    def finished(self, f: Finished, req: GenerationRequest, session: str, volatile: int) -> None:
        """Log the request, keep its record, count it."""
        plan = req.plan
        log_request(f, plan.captures, plan.miss, volatile, self.name, session, req.namespace)
        tag = self.namespaces.tag(req.namespace)
        self.activity.record(f, tag, miss=plan.miss, owner=(req.namespace, session))
        if self.metrics is not None:
            self.metrics.request(f, tag, plan.captures, plan.length)

    def error(self, code: str) -> None:
        """A call ended with gRPC status `code` (counted for the metrics)."""
        if self.metrics is not None:
            self.metrics.error(code)

    async def inspect(self, recent: int = 20) -> Inspection:
        """Live figures: the cache, each replica, the recent window, the latest requests."""
        cache, anchors, *generators = await asyncio.gather(
            self.manager.stats.remote(),
            self.manager.anchors.remote(),
            *(r.generator_stats.remote() for r in self.replicas),
            return_exceptions=True,
        )
        for value in (cache, anchors):
            if isinstance(value, ActorGone):
                raise Unavailable(f"the cache manager is unavailable (restarting): {value}")
            if isinstance(value, BaseException):
                raise value
        live = {str(i): s for i, s in enumerate(generators) if not isinstance(s, BaseException)}
        return inspection(
            cache, anchors, live, self.budgets, self.activity, self.namespaces, recent
        )

    async def cache_view(
        self, scope: str | None, deadline: float, recent: int = 50, operator: bool = True
    ) -> CacheView:
        """The cache page's figures for namespace `scope` (None: the whole cache); the
        memory shares for the `operator` alone."""
        tree = await self._ask_manager(self.manager.tree.remote(scope), deadline)
        if not operator:
            return cache_view(tree, self.activity, scope, recent)
        try:  # the disk tier's state: the operator's alone (it is the whole cache's)
            disk = disk_view(await asyncio.wait_for(self.inspect(0), deadline))
        except Exception as e:  # a replica restarting, the manager busy: the page still shows
            log.warning("cache page: the disk tier's state not read (%s)", e)
            disk = None
        return cache_view(tree, self.activity, scope, recent, self.memory, disk)

    async def stats(self, deadline: float):
        return await self._ask_manager(self.manager.stats.remote(), deadline)

    async def _ask_manager(self, ref, deadline: float):
        """A read of the cache manager; Unavailable, saying why, while it is restarting (a
        kill, a crash) or does not answer within the deadline."""
        try:
            return await asyncio.wait_for(ref, deadline)
        except asyncio.TimeoutError:
            raise Unavailable(f"the cache manager did not answer within {deadline:.0f} s")
        except ActorGone as e:
            raise Unavailable(f"the cache manager is unavailable (restarting): {e}") from None


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
