"""How failures become HTTP answers: OpenAI error bodies and statuses, and a client gone.

gRPC INVALID_ARGUMENT (and a request the bridge itself finds malformed) -> 400,
UNAUTHENTICATED -> 401, PERMISSION_DENIED -> 403, RESOURCE_EXHAUSTED (a full
queue) -> 429, UNAVAILABLE -> 503, anything else (a bug included) -> 500, always
as `{"error": {"message", "type", "param", "code"}}`. A client that goes away
before its response starts gets 499 (unseen), and its gRPC call is cancelled.
"""

import asyncio
import logging

from clients.client import LineageError
from clients.wire import InvalidInput

log = logging.getLogger(__name__)
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
}
DISCONNECT_POLL_S = 0.25  # how often a request not yet streaming checks for a gone client


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

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request, error):
        first = error.errors()[0] if error.errors() else {"loc": (), "msg": str(error)}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        return JSONResponse(error_body(message, "invalid_request_error", param), 400)

    @app.exception_handler(InvalidInput)
    async def bad_value(request, error):
        return JSONResponse(error_body(str(error), "invalid_request_error"), 400)

    @app.exception_handler(Exception)
    async def internal(request, error):  # a bug here, not the caller's fault: 500, logged
        log.exception("bridge: %s %s failed", request.method, request.url.path)
        return JSONResponse(error_body(f"internal error: {error}", "server_error"), 500)

    @app.exception_handler(LineageError)
    async def engine_error(request, error):
        status, body = lineage_error(error)
        return JSONResponse(body, status)

    @app.exception_handler(ClientDisconnected)
    async def client_gone(request, error):
        return Response(status_code=499)

    @app.exception_handler(HTTPException)
    async def http_error(request, error):
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(error.detail), kind), error.status_code)
