"""The bridge's FastAPI app: the gate, the error handlers, and the routes of each
wire format.

`create_app(engine, security)` builds it as a client of the engine: a gRPC
address (a `Backend` over the client library), or a backend already made (the
in-process one of `lineage serve --http-port`, clients.openai.in_process). The
body cap and the token check run first (clients.openai.guard), every failure is
answered OpenAI-shaped (clients.openai.errors), and chat completions
(clients.openai.chat_completions), `/v1/models` and `/health` are served.
FastAPI loads only here, when an app is built.
"""

from clients.openai import chat_completions
from clients.openai.backend import Backend
from clients.openai.errors import add_error_handlers
from clients.openai.guard import BearerAuth, BodyLimit, BridgeSecurity, bearer_token


def create_app(engine, security: BridgeSecurity | None = None):
    """The FastAPI app, a client of `engine` (a gRPC address, or a backend); app.state.backend.

    A caller's bearer token goes on to the engine with its calls, so the engine
    decides the namespace; with `security.tokens` the bridge also refuses
    unknown tokens itself (401) before it answers anything.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    security = security or BridgeSecurity()
    backend = Backend(engine) if isinstance(engine, str) else engine
    app = FastAPI(title="lineage OpenAI-compatible bridge", docs_url=None, redoc_url=None)
    app.state.backend = backend
    add_error_handlers(app)
    app.add_middleware(BodyLimit, limit=security.max_body_bytes)
    if security.tokens:
        app.add_middleware(BearerAuth, tokens=security.tokens)  # outermost: runs first
    chat_completions.add_routes(app, backend)

    @app.get("/v1/models")
    async def models(request: Request):
        info = await backend.model_info(bearer_token(request.headers))
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
