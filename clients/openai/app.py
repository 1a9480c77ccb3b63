"""The bridge's FastAPI app: the gate, the error handlers, and the routes of each wire format.

`create_app(engine, security, options)` builds it as a client of the engine: a
gRPC address (a `Backend` over the client library), or a backend already made
(the in-process one of `lineage serve --http-port`,
clients.openai.in_process). The body cap and the token check run first
(clients.openai.guard), every failure is answered in the shape of its wire
format (clients.openai.errors), and OpenAI chat completions
(clients.openai.chat_completions), Anthropic Messages
(clients.openai.anthropic_messages), OpenAI Responses (clients.openai.responses,
with its store), `/v1/models` (the served names and aliases:
clients.openai.models) and `/health` are served. FastAPI loads only here, when
an app is built.
"""

from dataclasses import dataclass, field

from clients.openai import anthropic_messages, chat_completions, responses
from clients.openai.backend import Backend
from clients.openai.errors import add_error_handlers
from clients.openai.guard import BearerAuth, BodyLimit, BridgeSecurity, api_key
from clients.openai.models import ServedModels
from clients.openai.response_store import ResponseStore


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

    A caller's token goes on to the engine with its calls, so the engine decides
    the namespace; with `security.tokens` the bridge also refuses unknown tokens
    itself (401) before it answers anything.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    security = security or BridgeSecurity()
    options = options or BridgeOptions()
    backend = Backend(engine) if isinstance(engine, str) else engine
    store = ResponseStore(options.store_dir, options.store_max, options.store_max_bytes)
    app = FastAPI(title="lineage OpenAI-compatible bridge", docs_url=None, redoc_url=None)
    app.state.backend, app.state.store, app.state.served = backend, store, options.served
    add_error_handlers(app)
    app.add_middleware(BodyLimit, limit=security.max_body_bytes)
    if security.tokens:
        app.add_middleware(BearerAuth, tokens=security.tokens)  # outermost: runs first
    chat_completions.add_routes(app, backend)
    anthropic_messages.add_routes(app, backend, options.served)
    responses.add_routes(app, backend, options.served, store)

    @app.get("/v1/models")
    async def models(request: Request):
        info = await backend.model_info(api_key(request.headers))
        return options.served.listing(info)

    @app.get("/health")
    async def health():
        status = await backend.health()
        return JSONResponse({"status": status}, 200 if status == "SERVING" else 503)

    return app
