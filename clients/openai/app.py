"""The bridge's FastAPI app: the gate, the error handlers, and the routes of each wire format.

`create_app(grpc_address, security)` builds it as a client of the engine at that
address: the caller gate and the body cap run first (clients.openai.guard),
every failure is answered OpenAI-shaped (clients.openai.errors), and chat
completions (clients.openai.chat_completions), `/v1/models` and `/health` are
served. FastAPI loads only here, when an app is built.
"""

from clients.openai import chat_completions
from clients.openai.backend import Backend
from clients.openai.errors import add_error_handlers
from clients.openai.guard import BodyLimit, BridgeSecurity, CallerGate, caller_of


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
    app.state.backend = backend
    add_error_handlers(app)
    app.add_middleware(BodyLimit, limit=security.max_body_bytes)
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
