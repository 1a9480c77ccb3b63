"""The bridge's FastAPI app: the gate, the error handlers, and the routes of each wire format.

`create_app(grpc_address, security)` builds it as a client of the engine at that
address: the caller gate and the body cap run first (clients.openai.guard),
every failure is answered OpenAI-shaped (clients.openai.errors), and chat
completions (clients.openai.chat_completions), `/v1/models` and `/health` are
served. A large body's JSON is parsed on a worker thread, off the event loop
the bridge may share with the engine (`lineage serve --http-port`). FastAPI
loads only here, when an app is built.
"""

import asyncio
import json

from clients.openai import chat_completions
from clients.openai.backend import Backend
from clients.openai.errors import add_error_handlers
from clients.openai.guard import BodyLimit, BridgeSecurity, CallerGate, caller_of

# Bodies from this size on are parsed off the event loop (a thread's start costs less).
OFF_LOOP_JSON_BYTES = 64 << 10


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
                if len(body) >= OFF_LOOP_JSON_BYTES and kind.endswith("json"):
                    try:
                        request._json = await asyncio.to_thread(json.loads, body)
                    except (ValueError, RecursionError) as error:  # parsed once, answered here
                        raise HTTPException(400, f"the body is not JSON: {error}") from None
                return await handler(request)

            return parse_then_handle

    return OffLoopJSONRoute


def create_app(grpc_address: str, security: BridgeSecurity | None = None):
    """The FastAPI app, a client of the engine at `grpc_address`; app.state.backend.

    Each call to the engine carries the token its caller sent, exactly, and no
    other; with `security.identities` the bridge also refuses unknown tokens
    itself (401) before it answers anything, and places each tenant in its own
    namespace.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    security = security or BridgeSecurity()
    backend = Backend(grpc_address)
    app = FastAPI(title="lineage OpenAI-compatible bridge", docs_url=None, redoc_url=None)
    app.router.route_class = off_loop_json_route()
    app.state.backend = backend
    add_error_handlers(app)
    app.add_middleware(BodyLimit, limit=security.max_body_bytes, deadline=security.body_deadline)
    app.add_middleware(CallerGate, identities=security.identities)  # outermost: runs first
    chat_completions.add_routes(app, backend)

    @app.get("/v1/models")
    async def models(request: Request):
        info = await backend.model_info(caller_of(request), fresh=True)  # the engine checks
        return {
            "object": "list",
            "data": [
                {
                    "id": info["id"],
                    "object": "model",
                    "created": 0,
                    "owned_by": "lineage",
                    "max_model_len": info["max_context"],
                    "root": info["reply"]["model"],
                }
            ],
        }

    @app.get("/health")
    async def health():
        status = await backend.health()
        return JSONResponse({"status": status}, 200 if status == "SERVING" else 503)

    return app
