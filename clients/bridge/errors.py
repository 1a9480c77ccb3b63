"""How failures become HTTP answers: error bodies and statuses in each wire's shape.

gRPC INVALID_ARGUMENT (and a request the bridge itself finds malformed) -> 400,
UNAUTHENTICATED -> 401, PERMISSION_DENIED -> 403, RESOURCE_EXHAUSTED (a full
queue) -> 429, UNAVAILABLE -> 503 (Anthropic's 529 overloaded), anything else (a
bug included) -> 500. OpenAI's paths answer `{"error": {"message", "type", "param",
"code"}}`, Anthropic's (`/v1/messages`) `{"type": "error", "error": {"type",
"message"}}` (`error_json`, chosen by `wire_of(path)`). A `WireError` carries a
status and a message for either. A client that goes away before its response
starts gets 499 (unseen), and its gRPC call is cancelled.
"""

import asyncio
import logging

from clients.bridge.models import ModelNotFound
from clients.client import LineageError
from clients.wire import InvalidInput

log = logging.getLogger(__name__)
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,  # a model the engine does not serve
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
}
DISCONNECT_POLL_S = 0.25  # how often a request not yet streaming checks for a gone client
# Anthropic's error types by HTTP status (its docs' "Errors" table).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)


class WireError(Exception):
    """A request the bridge answers with `status` and `message` (and OpenAI's `param`
    and `code`), in the shape of the wire format the request came in."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def wire_of(path: str) -> str:
    """ "anthropic" for Anthropic's paths, else "openai"."""
    return "anthropic" if path.startswith(ANTHROPIC_PATHS) else "openai"


def error_json(
    wire: str, status: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    """The error body of `wire` for an answer of `status`."""
    if wire == "anthropic":
        kind = ANTHROPIC_TYPES.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = "invalid_request_error" if status < 500 else "server_error"
    kind = {401: "auth_error", 429: "rate_limit_error"}.get(status, kind)
    return error_body(message, kind, param, code)


def engine_status(code: str, wire: str = "openai") -> int:
    """The HTTP status of a failed gRPC call's code, in `wire`."""
    status = HTTP_STATUS.get(code, 500)
    return 529 if wire == "anthropic" and status == 503 else status


class ClientDisconnected(Exception):
    """The HTTP client went away before the response started (answered 499, unseen)."""


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def lineage_error(error: LineageError) -> tuple[int, dict]:
    """(HTTP status, OpenAI error body) of a failed gRPC call."""
    status = HTTP_STATUS.get(error.code, 500)
    kind = "invalid_request_error" if status < 500 else "server_error"
    kind = "rate_limit_error" if status == 429 else kind
    return status, error_body(error.message, kind, code=error.code.lower())


async def unless_disconnected(request, awaitable):
    """Await `awaitable` unless the HTTP client goes away first (then cancel it)."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected()
    finally:
        task.cancel()


def add_error_handlers(app) -> None:
    """Every failure of a route answered as above."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException

    def answer(request, status: int, message: str, param=None, code=None) -> JSONResponse:
        wire = wire_of(request.url.path)
        return JSONResponse(error_json(wire, status, message, param, code), status)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request, error):
        first = error.errors()[0] if error.errors() else {"loc": (), "msg": str(error)}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        return answer(request, 400, message, param)

    @app.exception_handler(InvalidInput)
    async def bad_value(request, error):
        return answer(request, 400, str(error))

    @app.exception_handler(ModelNotFound)
    async def unknown_model(request, error):
        return answer(request, 404, str(error), "model", "model_not_found")

    @app.exception_handler(WireError)
    async def refused(request, error):
        return answer(request, error.status, error.message, error.param, error.code)

    @app.exception_handler(Exception)
    async def internal(request, error):  # a bug here, not the caller's fault: 500, logged
        log.exception("bridge: %s %s failed", request.method, request.url.path)
        return answer(request, 500, f"internal error: {error}")

    @app.exception_handler(LineageError)
    async def engine_error(request, error):
        wire = wire_of(request.url.path)
        status = engine_status(error.code, wire)
        return answer(request, status, error.message, code=error.code.lower())

    @app.exception_handler(ClientDisconnected)
    async def client_gone(request, error):
        return Response(status_code=499)

    @app.exception_handler(HTTPException)
    async def http_error(request, error):
        return answer(request, error.status_code, str(error.detail))
