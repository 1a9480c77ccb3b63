"""The bridge's FastAPI app: the gate, the error handlers, and the routes of each wire format.

`create_app(engine, security, options)` builds it as a client of the engine: a
gRPC address (a `Backend` over the client library), or a backend already made
(the in-process one of `lineage serve --http-port`,
clients.bridge.in_process). The body cap and the token check run first
(clients.bridge.guard), every failure is answered in the shape of its wire
format (clients.bridge.errors), and OpenAI chat completions
(clients.bridge.chat_completions), Anthropic Messages
(clients.bridge.anthropic_messages), OpenAI Responses (clients.bridge.responses,
with its store), `/v1/models` (the served names and aliases:
clients.bridge.models) and `/health` are served. FastAPI loads only here, when
an app is built.
"""

import asyncio
import json
from dataclasses import dataclass, field

from clients.bridge import anthropic_messages, cache_page, chat_completions, responses
from clients.bridge.backend import Backend
from clients.bridge.errors import add_error_handlers
from clients.bridge.guard import BodyLimit, BridgeSecurity, CallerGate, caller_of
from clients.bridge.models import ServedModels
from clients.bridge.response_store import ResponseStore
from engine.config import MAX_JSON_DEPTH
from engine.server.security.limits import text_depth

# Bodies from this size on are parsed off the event loop (a thread's start costs less).
OFF_LOOP_JSON_BYTES = 64 << 10


def check_depth(body: bytes) -> None:
    """ValueError when the body nests deeper than any parser here may recurse, measured on
    the text (engine.server.security.limits.text_depth): a parser stopped by Python's
    recursion limit leaves its thread where every finalizer the collector runs fails."""
    depth = text_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"the body nests {depth} levels deep; the limit is {MAX_JSON_DEPTH}")


def parse_body(body: bytes):
    """A request body's JSON, its depth checked first; ValueError names what is wrong."""
    check_depth(body)
    try:
        return json.loads(body)
    except ValueError as error:
        raise ValueError(f"the body is not JSON: {error}") from None


def off_loop_json_route():
    """A FastAPI route class whose large JSON bodies are parsed on a worker thread.

    FastAPI parses a body with Starlette's `Request.json()`, on the event loop;
    the request it hands the route keeps the parsed value (`_json`), so parsing
    it here first, in a thread, leaves nothing for the loop to parse.
    """
    from fastapi.routing import APIRoute
    from starlette.exceptions import HTTPException

    class OffLoopJSONRoute(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def parse_then_handle(request):
                body = await request.body()
                kind = request.headers.get("content-type", "json").split(";")[0].strip()
                if kind.endswith("json"):
                    try:
                        if len(body) >= OFF_LOOP_JSON_BYTES:
                            request._json = await asyncio.to_thread(parse_body, body)
                        else:  # FastAPI parses it, once its depth is known to be bounded
                            check_depth(body)
                    except ValueError as error:  # parsed once, answered here
                        raise HTTPException(400, str(error)) from None
                return await handler(request)

            return parse_then_handle

    return OffLoopJSONRoute


@dataclass(frozen=True)
class BridgeOptions:
    """What the bridge serves: the model names, and where and how much of `store` it keeps."""

    served: ServedModels = field(default_factory=ServedModels)
    store_dir: str | None = None  # None: stored responses live in memory only
    store_max: int = 10_000
    store_max_bytes: int = 1 << 30


def create_app(
    engine,
    security: BridgeSecurity | None = None,
    options: BridgeOptions | None = None,
):
    """The FastAPI app, a client of `engine` (a gRPC address, or a backend);
    app.state.backend and app.state.store (close it when the app stops).

    Each call to the engine carries the token its caller sent, exactly, and no
    other; with `security.identities` the bridge also refuses unknown tokens
    itself (401) before it answers anything, and places each tenant in its own
    namespace.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    security = security or BridgeSecurity()
    options = options or BridgeOptions()
    backend = Backend(engine) if isinstance(engine, str) else engine
    store = ResponseStore(options.store_dir, options.store_max, options.store_max_bytes)
    app = FastAPI(title="lineage OpenAI-compatible bridge", docs_url=None, redoc_url=None)
    app.router.route_class = off_loop_json_route()
    app.state.backend, app.state.store, app.state.served = backend, store, options.served
    add_error_handlers(app)
    app.add_middleware(BodyLimit, limit=security.max_body_bytes, deadline=security.body_deadline)
    app.add_middleware(CallerGate, identities=security.identities)  # outermost: runs first
    chat_completions.add_routes(app, backend)
    anthropic_messages.add_routes(app, backend, options.served)
    responses.add_routes(app, backend, options.served, store)
    cache_page.add_routes(app, backend)

    @app.get("/v1/models")
    async def models(request: Request):
        info = await backend.model_info(caller_of(request), fresh=True)  # the engine checks
        return options.served.listing(info)

    @app.get("/health")
    async def health():
        status = await backend.health()
        return JSONResponse({"status": status}, 200 if status == "SERVING" else 503)

    return app
