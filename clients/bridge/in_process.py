"""The bridge's engine side when it runs in the engine's own process (`lineage serve
--http-port`): the front end called directly, no gRPC loopback.

`InProcessBackend(engine)` offers what the routes use of `Backend` (`stream`
for a Caller, `model_info`, `checks_tokens`, `health`, `close`), over a
RunningEngine (engine.server.running.serve). A call runs exactly the gRPC servicer's
domain side (engine.server.rpc.service `generate_events`: the same limits, the
caller's token and the identity it names, its namespace, the same errors as
status names), and its events become the client library's (clients.wire:
Chunk, Progress, Final) without a proto in between, shown as the gRPC server
shows them (engine.server.observe.figures: exact, or the block alone). A token the
engine does not know is refused here as the gRPC interceptor refuses it.

It knows the engine's front end and the client library's types; it is imported
only in the engine's process (a client process never loads it).
"""

from __future__ import annotations

import asyncio

from clients.client import LineageError
from clients.wire import (
    Chunk,
    Final,
    Progress,
    Restore,
    ResultCollector,
    TokenLogprob,
    Usage,
    build_request,
    message_to_dict,
)
from engine.runtime.events import Finished, Tokens
from engine.runtime.events import Progress as EngineProgress
from engine.server.observe.figures import ClientFigures
from engine.server.rpc.replies import model_name, to_tree_reply
from engine.server.rpc.service import DOMAIN_ERRORS, generate_events, status_of, tree_scope


class InProcessStream:
    """A running call for asyncio, as clients.client.AsyncStream: `async for event in it`,
    `cancel()`, `aclose()`, `result()`."""

    def __init__(self, events, exact: bool):
        self._events = events  # the front end's async generator (lists of engine events)
        self._figures = ClientFigures(exact)  # what the client is shown
        self._ready: list = []
        self._done = False
        self._collector = ResultCollector()

    def __aiter__(self) -> "InProcessStream":
        return self

    async def __anext__(self):
        while not self._ready:
            if self._done:
                raise StopAsyncIteration
            try:
                batch = await anext(self._events)
            except StopAsyncIteration:
                self._done = True
                raise
            except DOMAIN_ERRORS as error:
                self._done = True
                code, message = status_of(error)
                raise LineageError(code.name, message) from None
            shown = (self._figures.shown(e) for e in batch)
            self._ready = [self._wire(e) for e in shown if e is not None]
        event = self._ready.pop(0)
        self._collector.add(event)
        if isinstance(event, Final) and event.finish_reason == "error":
            self._done = True
            raise LineageError("INTERNAL", "generation failed")
        return event

    def _wire(self, event):
        """An engine event (as the client is shown it) as the client library's."""
        if isinstance(event, Tokens):
            return Chunk(event.ids, event.text, logprobs=_logprobs(event), index=event.index)
        if isinstance(event, EngineProgress):
            return Progress(done=event.done, total=event.total)
        assert isinstance(event, Finished), event
        return Final(
            finish_reason=event.finish_reason.value,
            usage=Usage(event.prompt_tokens, event.cached_tokens, event.completion_tokens),
            restore=Restore(kind=event.restore_kind.value, length=event.restore_length),
            timing=event.timing,
            request_id=event.request_id,
            replica=event.replica,
            incomplete=event.incomplete,
            index=event.index,
            stop_sequence=event.stop_sequence,
        )

    def cancel(self) -> None:
        """Stop the call: the front end cancels the request at its replica."""
        if not self._done:
            self._done = True
            asyncio.ensure_future(self._events.aclose())

    async def aclose(self) -> None:
        self._done = True
        await self._events.aclose()

    async def result(self):
        try:
            async for _ in self:
                pass
        finally:
            self.cancel()
        return self._collector.result()


class InProcessClient:
    """`stream(...)` as AsyncClient's, on the engine in this process."""

    def __init__(self, engine):
        self.engine = engine

    def stream(self, messages=None, tools=None, prompt=None, prompt_ids=None, **kwargs):
        auth_token = kwargs.pop("auth_token", None)
        metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else ()
        request = build_request(messages, tools, prompt, prompt_ids, **kwargs)
        e = self.engine
        if e.auth.enabled and e.auth.identity(metadata) is None:
            raise LineageError("UNAUTHENTICATED", "a known bearer token is required")
        try:  # the request's own checks (its prompt, its constraint) run here
            if e.fleet is not None:  # several models: routed by the name asked for
                events = e.fleet.generate_events(e.auth, request, metadata)
            else:
                events = generate_events(e.frontend, e.auth, request, metadata)
        except DOMAIN_ERRORS as error:
            code, message = status_of(error)
            raise LineageError(code.name, message) from None
        return InProcessStream(events, e.exact_figures)

    async def close(self) -> None:
        pass


class InProcessBackend:
    """The bridge's engine side in the engine's process: its front end, health and model."""

    address = "the engine in this process"

    def __init__(self, engine):
        self.engine = engine
        self.client = InProcessClient(engine)

    def stream(self, caller, namespace: str = "", **request) -> InProcessStream:
        """A Generate call for `caller` (clients.bridge.guard's Caller), in the namespace it
        may use of the one it named."""
        namespace = caller.namespace(namespace)
        return self.client.stream(auth_token=caller.token, namespace=namespace, **request)

    async def model_info(self, caller=None, fresh: bool = False) -> dict:
        """ModelInfo as {"id", "max_context", "fingerprint", "output_format", "reply"}, as
        Backend gives it; with `fresh`, the caller's token is checked as the engine would."""
        auth = self.engine.auth
        if fresh and auth.enabled:
            token = getattr(caller, "token", None)
            metadata = (("authorization", f"Bearer {token}"),) if token else ()
            if auth.identity(metadata) is None:
                raise LineageError("UNAUTHENTICATED", "a known bearer token is required")
        i = self.engine.frontend.info
        model = model_name(i.path)
        output_format = self.engine.frontend.builder.output_format
        reply = {
            "model": model,
            "model_type": i.model_type,
            "vocab_size": i.vocab_size,
            "max_context": i.max_context,
            "fingerprint": i.fingerprint,
            "cache_mode": self.engine.frontend.cache_mode,
            "has_state_layers": i.has_state_layers,
            "kernels": list(i.kernels),
            "output_format": output_format,
        }
        if self.engine.fleet is not None:
            from clients.wire import message_to_dict

            reply["models"] = [message_to_dict(m) for m in self.engine.fleet.listing()]
        return {
            "id": model,
            "max_context": i.max_context,
            "fingerprint": i.fingerprint,
            "output_format": output_format,
            "reply": reply,
        }

    async def cache_tree(self, caller, namespace: str | None, recent: int = 50) -> dict:
        """The CacheTree RPC's dict, as the gRPC servicer answers it for this caller."""
        token = getattr(caller, "token", None)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        auth = self.engine.auth
        if auth.enabled and auth.identity(metadata) is None:
            raise LineageError("UNAUTHENTICATED", "a known bearer token is required")
        scope, operator = tree_scope(auth, metadata, namespace)
        try:
            view = await self.engine.frontend.cache_view(scope, recent, operator)
        except DOMAIN_ERRORS as error:
            code, message = status_of(error)
            raise LineageError(code.name, message) from None
        return message_to_dict(to_tree_reply(view))

    async def checks_tokens(self) -> bool:
        """Whether the engine refuses a call without a token."""
        return self.engine.auth.enabled

    async def health(self) -> str:
        """The engine's health status name, as the gRPC health service reports it."""
        from grpc_health.v1 import health_pb2

        reply = await self.engine.health.Check(health_pb2.HealthCheckRequest(service=""), None)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    async def close(self) -> None:
        pass


def _logprobs(event: Tokens) -> tuple:
    """The engine's log-probabilities of a Tokens event as the client library's."""
    return tuple(
        TokenLogprob(
            token_id,
            lp.token,
            lp.logprob,
            tuple(TokenLogprob(i, t, v) for (i, v), t in zip(lp.top, lp.top_tokens)),
        )
        for token_id, lp in zip(event.ids, event.logprobs)
    )
