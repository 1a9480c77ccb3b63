"""The gRPC servicer: proto in, dataclasses to the Frontend, proto out.

The servicer routes each call and answers it; the translation is in two modules
of its own: a request's proto into the domain (engine.server.rpc.requests) and
the domain's answers into proto (engine.server.rpc.replies). Every domain error
becomes a status code here, in one place (`status_of`): InvalidRequest ->
INVALID_ARGUMENT, Unavailable (and a dead actor) -> UNAVAILABLE, a full queue ->
RESOURCE_EXHAUSTED, an unknown model -> NOT_FOUND. With several models served
(engine.server.running.fleet) a call goes to the one it names. Standard health
checking is served beside the Engine service (Check open, Watch capped:
engine.server.rpc.health), and server reflection on loopback (or by flag). With
tokens configured (engine.server.security.auth) every call but Health/Check
needs a bearer token, and the namespace comes from the token. Unless the
operator asks for exact figures, every figure that depends on the restore
length goes out from its block alone (engine.server.observe.figures), so a
caller cannot probe a prompt it shares token by token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from engine.config import ServerConfig
from engine.proto import engine_pb2, engine_pb2_grpc
from engine.runtime.events import Finished, FinishReason
from engine.server.errors import ActorGone, InvalidRequest, Overloaded, Unavailable, UnknownModel
from engine.server.front.frontend import Frontend
from engine.server.observe.figures import ClientFigures
from engine.server.prompts.constraints import to_grammar
from engine.server.rpc.health import EngineSlots, HealthGate
from engine.server.rpc.replies import (
    coalesce,
    model_name,
    to_event,
    to_inspect_reply,
    to_tree_reply,
)
from engine.server.rpc.requests import check_request, to_prompt_input, to_sampling
from engine.server.security.auth import Authenticator, AuthInterceptor, server_credentials
from engine.server.security.limits import check_identifier

log = logging.getLogger(__name__)
SERVICE = engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name


def tree_scope(auth: Authenticator, metadata, requested: str | None) -> tuple[str | None, bool]:
    """(the namespace whose cache a caller may see, whether it is the operator): a tenant
    its own, whatever it names; an admin (or anyone, with no tokens) the one it names, or
    every one (None)."""
    identity = auth.identity(metadata)
    if auth.enabled and (identity is None or not identity.admin):
        return (identity.namespace if identity is not None else ""), False
    return requested, True


class EngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(
        self,
        frontend: Frontend,
        auth: Authenticator | None = None,
        exact_figures: bool = True,
        fleet=None,
    ):
        self.frontend = frontend
        self.auth = auth or Authenticator()
        self.exact_figures = exact_figures
        self.fleet = fleet  # engine.server.running.fleet.Fleet: several models, routed by name

    async def Generate(self, request, context):
        try:
            metadata = context.invocation_metadata()
            if self.fleet is not None:
                events = self.fleet.generate_events(self.auth, request, metadata)
            else:
                events = generate_events(self.frontend, self.auth, request, metadata)
            figures = ClientFigures(self.exact_figures)  # exact, or the block alone
            async for batch in events:
                for event in coalesce(batch):
                    if (shown := figures.shown(event)) is not None:
                        yield to_event(shown)
                    if isinstance(event, Finished) and event.finish_reason == FinishReason.ERROR:
                        await self._abort(
                            context, grpc.StatusCode.INTERNAL, event.error or "generation failed"
                        )
        except DOMAIN_ERRORS as e:
            await self._abort(context, *status_of(e))

    async def _abort(self, context, code: grpc.StatusCode, message: str) -> None:
        """End the call with `code` (counted in the metrics)."""
        self.frontend.error(code.name)
        await context.abort(code, message)

    async def _require_admin(self, context, what: str) -> None:
        """The whole cache's figures are the operator's alone, when tokens are on."""
        if self.auth.enabled:
            identity = self.auth.identity(context.invocation_metadata())
            if identity is None or not identity.admin:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED, f"{what} needs an admin token"
                )

    async def _current(self, context, model: str = "") -> Frontend:
        """The front end whose figures CacheStats and Inspect give: with several models,
        the named one's (NOT_FOUND for an unknown name, UNAVAILABLE for one not loaded),
        or the first loaded one's."""
        if self.fleet is None:
            return self.frontend
        try:
            return self.fleet.frontend_of(model)
        except DOMAIN_ERRORS as e:
            await context.abort(*status_of(e))

    async def CacheStats(self, request, context):
        await self._require_admin(context, "CacheStats")
        frontend = await self._current(context, request.model)
        try:
            s = await frontend.stats()
        except DOMAIN_ERRORS as e:  # the cache manager restarting: UNAVAILABLE, saying so
            await self._abort(context, *status_of(e))
        return engine_pb2.CacheStatsReply(**dataclasses.asdict(s))

    async def Inspect(self, request, context):
        await self._require_admin(context, "Inspect")
        frontend = await self._current(context, request.model)
        try:
            inspection = await frontend.inspect(request.recent or 20)
        except DOMAIN_ERRORS as e:
            await self._abort(context, *status_of(e))
        return to_inspect_reply(inspection)

    async def CacheTree(self, request, context):
        requested = request.namespace if request.HasField("namespace") else None
        scope, operator = tree_scope(self.auth, context.invocation_metadata(), requested)
        try:
            if scope:
                check_identifier("namespace", scope, self.frontend.limits)
            view = await self.frontend.cache_view(scope, request.recent or 50, operator)
        except DOMAIN_ERRORS as e:
            await self._abort(context, *status_of(e))
        return to_tree_reply(view)

    async def ModelInfo(self, request, context):
        i = self.frontend.info
        return engine_pb2.ModelInfoReply(
            model=model_name(i.path),
            model_type=i.model_type,
            vocab_size=i.vocab_size,
            max_context=i.max_context,
            fingerprint=i.fingerprint,
            cache_mode=self.frontend.cache_mode,
            has_state_layers=i.has_state_layers,
            kernels=list(i.kernels),
            output_format=self.frontend.builder.output_format,
            models=self.fleet.listing() if self.fleet is not None else (),
        )


def generate_events(frontend: Frontend, auth: Authenticator, request, metadata):
    """A Generate call's events (lists of them, a step's at a time), from its proto request:
    checked against the limits, its namespace the caller's identity's. What the gRPC
    servicer and the in-process bridge both run; raises the domain errors (`status_of`)."""
    limits = frontend.limits
    sampling = to_sampling(request.sampling)
    check_request(request, sampling, frontend.info.vocab_size, limits)
    identity = auth.identity(metadata)
    inp = to_prompt_input(request, limits)
    grammar = None
    if request.HasField("constraint"):
        builder = frontend.builder
        switched_off = (inp.template_kwargs or {}).get("enable_thinking") is False
        grammar = to_grammar(
            request.constraint,
            inp.tools,
            builder.output_format,
            limits,
            builder.special_markers,
            reasoning=not switched_off,
        )
        grammar = builder.grammars.admit(grammar)  # compiles, or drops an optional one
    return frontend.generate(
        inp,
        sampling,
        namespace=auth.namespace(identity, request.namespace),
        request_id=request.request_id,
        session=request.session,
        grammar=grammar,
    )


# The domain errors a call can end with, and their status codes (one place).
DOMAIN_ERRORS = (InvalidRequest, Unavailable, Overloaded, ActorGone, UnknownModel)


def status_of(error: Exception) -> tuple[grpc.StatusCode, str]:
    """A domain error's gRPC status code and message."""
    if isinstance(error, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
    if isinstance(error, UnknownModel):
        return grpc.StatusCode.NOT_FOUND, str(error)
    if isinstance(error, ActorGone):
        return grpc.StatusCode.UNAVAILABLE, f"the model actor is unavailable: {error}"
    assert isinstance(error, Unavailable), error
    return grpc.StatusCode.UNAVAILABLE, str(error)


async def create_server(
    frontend: Frontend,
    host: str = "127.0.0.1",
    port: int = 0,
    security: ServerConfig | None = None,
    local_socket: str | None = None,
    max_concurrent_rpcs: int | None = None,
    health_servicer: health.aio.HealthServicer | None = None,
    fleet=None,
):
    """(server, bound port, health servicer); the server is started.

    Health is SERVING unless `health_servicer` is given: then it says what its
    owner (the supervisor) set. It is served through a HealthGate (Check open,
    Watch streams capped and ended after a while; engine.server.rpc.health).

    `security` brings tokens, TLS, reflection, the figures' rounding and the
    health watchers' limits (its host and port are not used); None serves as
    on loopback with none of them and exact figures. `local_socket` also
    serves on that Unix socket, without TLS (tokens still apply): the bridge
    sidecar's way in. Past `max_concurrent_rpcs` Engine calls at once the
    server answers RESOURCE_EXHAUSTED; health checks never count.
    """
    security = security or ServerConfig(host=host, exact_cache_figures=True)
    auth = Authenticator(security.tokens)
    interceptors = [AuthInterceptor(auth)] if auth.enabled else []
    if max_concurrent_rpcs is not None:
        interceptors.append(EngineSlots(max_concurrent_rpcs, SERVICE))
    # gRPC itself refuses anything far past the limit; the servicer answers
    # INVALID_ARGUMENT, naming the limit, for what lies between.
    receive = frontend.limits.max_request_bytes + (1 << 20)
    server = grpc.aio.server(
        options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", receive)],
        interceptors=interceptors or None,
    )
    servicer = EngineServicer(frontend, auth, security.exact_cache_figures, fleet)
    engine_pb2_grpc.add_EngineServicer_to_server(servicer, server)
    own_health = health_servicer is None
    health_servicer = health_servicer or health.aio.HealthServicer()
    gate = HealthGate(health_servicer, security.health_watchers, security.health_watch_seconds)
    health_pb2_grpc.add_HealthServicer_to_server(gate, server)
    if security.reflection_on:
        reflection.enable_server_reflection(
            (
                SERVICE,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        if security.tls_cert:
            bound = server.add_secure_port(address, server_credentials(security))
        else:
            bound = server.add_insecure_port(address)
        if bound == 0:
            raise OSError(f"cannot bind {host}:{port}")
        if local_socket and not server.add_insecure_port(f"unix:{local_socket}"):
            raise OSError(f"cannot bind unix:{local_socket}")
    except BaseException:  # grpc raises RuntimeError for a taken port: the server goes too
        await server.stop(None)
        raise
    await server.start()
    if own_health:
        await set_serving(health_servicer, True)
    return server, bound, health_servicer


async def set_serving(health_servicer: health.aio.HealthServicer, up: bool) -> None:
    """The engine's health, for the whole server and its Engine service alike."""
    status = health_pb2.HealthCheckResponse
    for name in ("", SERVICE):
        await health_servicer.set(name, status.SERVING if up else status.NOT_SERVING)


async def stop_server(server, health_servicer, frontend: Frontend, grace: float = 2.0) -> None:
    """Health NOT_SERVING, in-flight streams end with UNAVAILABLE, then the server stops."""
    await set_serving(health_servicer, False)
    if frontend is not None:  # None: the caller closes its front ends (engine.server.running.fleet)
        frontend.close()
    await asyncio.sleep(0.2)  # let the streams in flight end with UNAVAILABLE
    await server.stop(grace)
    if frontend is not None:
        frontend.prompt_thread.shutdown(wait=False)
