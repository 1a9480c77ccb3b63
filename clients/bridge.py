"""An OpenAI-compatible HTTP bridge (FastAPI on uvicorn), a client of the gRPC API.

Translates `/v1/chat/completions`, `/v1/completions`, `/v1/models` and `/health`
into Generate, ModelInfo and health-check calls (clients.client.AsyncClient)
and the answers back into OpenAI shapes, as server-sent events when `stream` is
set. It knows the OpenAI wire format and the model's `<tool_call>` text; it
knows nothing of models, caches or Ray, and never loads MLX. gRPC
INVALID_ARGUMENT (and a request the bridge itself finds malformed) -> 400,
RESOURCE_EXHAUSTED (a full queue) -> 429, UNAVAILABLE -> 503, anything else
(a bug included) -> 500, always as `{"error": {"message", "type", "param",
"code"}}`; a body over 16 MiB -> 413
(clients.bridge_guard). A client that disconnects
cancels its gRPC call, which frees its batch slot. The cache namespace is the
`X-Cache-Namespace` header, else the request's `user` (under the caller's
tenant namespace when the engine has tokens: the caller's bearer token goes on
to the engine). UNAUTHENTICATED -> 401, PERMISSION_DENIED -> 403.

`start_bridge(...)` serves in the running loop (`lineage serve --http-port`);
`run_bridge(...)` is the blocking job of `lineage bridge` (both in
clients.bridge_server, re-exported here), whose CLI plug-in (HELP,
add_arguments, run) this module is. FastAPI, uvicorn and pydantic load
only when a bridge is built, so the import stays cheap; and no `from __future__
import annotations`, since FastAPI reads the annotations of the endpoints
defined inside create_app.
"""

import asyncio
import json
import logging
import time
import uuid
from pathlib import PurePath
from types import SimpleNamespace

from clients.bridge_guard import (
    BearerAuth,
    BodyLimit,
    BridgeSecurity,
    bearer_token,
)
from clients.bridge_server import (  # noqa: F401  (re-exported: the bridge's public API)
    BridgeHandle,
    bridge_security,
    run_bridge,
    start_bridge,
)
from clients.client import DEFAULT_SERVER, AsyncClient, Chunk, Final, LineageError, Progress
from clients.tool_calls import (  # noqa: F401  (re-exported)
    TOOL_CALL_START,
    ToolCallStream,
    parse_tool_calls,
)
from clients.wire import InvalidInput

HELP = "serve an OpenAI-compatible HTTP API in front of a running engine"
log = logging.getLogger(__name__)
_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
}
DISCONNECT_POLL_S = 0.25  # how often a request not yet streaming checks for a gone client


class ClientDisconnected(Exception):
    """The HTTP client went away before the response started (answered 499, unseen)."""


# ------------------------------------------------------- OpenAI shapes ----


def _usage(usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _lineage_error(error: LineageError) -> tuple[int, dict]:
    """(HTTP status, OpenAI error body) of a failed gRPC call."""
    status = _HTTP_STATUS.get(error.code, 500)
    kind = "invalid_request_error" if status < 500 else "server_error"
    kind = "rate_limit_error" if status == 429 else kind
    return status, error_body(error.message, kind, code=error.code.lower())


class _Shape:
    """The envelope shared by the chunks and the whole response of one request."""

    object_whole = object_chunk = ""

    def __init__(self, rid: str, info: dict):
        self.id, self.created = rid, int(time.time())
        self.model, self.fingerprint = info["id"], info["fingerprint"]

    def envelope(self, kind: str, choices: list, **extra) -> dict:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
            **extra,
        }

    def usage_chunk(self, final: Final) -> dict:
        return self.envelope(self.object_chunk, [], usage=_usage(final.usage))


class ChatShape(_Shape):
    """chat.completion and chat.completion.chunk objects; tool calls parsed when `tools`."""

    object_whole, object_chunk = "chat.completion", "chat.completion.chunk"

    def __init__(self, rid: str, info: dict, tools: bool):
        super().__init__(f"chatcmpl-{rid}", info)
        self.stream = ToolCallStream() if tools else None

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
        return self.envelope(
            self.object_chunk,
            [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        )

    def head(self) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def delta(self, text: str) -> list[dict]:
        text = self.stream.feed(text) if self.stream else text
        return [self._chunk({"content": text})] if text else []

    def finish(self, final: Final) -> list[dict]:
        content, calls = self.stream.finish() if self.stream else ("", [])
        out = [self._chunk({"content": content})] if content else []
        if calls:
            out.append(self._chunk({"tool_calls": [dict(c, index=i) for i, c in enumerate(calls)]}))
        out.append(self._chunk({}, "tool_calls" if calls else final.finish_reason))
        return out

    def whole(self, result) -> dict:
        content, calls = parse_tool_calls(result.text) if self.stream else (result.text, [])
        message = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": "tool_calls" if calls else result.finish_reason,
        }
        return self.envelope(self.object_whole, [choice], usage=_usage(result.usage))


class TextShape(_Shape):
    """text_completion objects (`/v1/completions`)."""

    object_whole = object_chunk = "text_completion"

    def __init__(self, rid: str, info: dict):
        super().__init__(f"cmpl-{rid}", info)

    def _choice(self, text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def head(self) -> list[dict]:
        return []

    def delta(self, text: str) -> list[dict]:
        return [self.envelope(self.object_chunk, [self._choice(text, None)])] if text else []

    def finish(self, final: Final) -> list[dict]:
        return [self.envelope(self.object_chunk, [self._choice("", final.finish_reason)])]

    def whole(self, result) -> dict:
        return self.envelope(
            self.object_whole,
            [self._choice(result.text, result.finish_reason)],
            usage=_usage(result.usage),
        )


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _events_as_sse(first, stream, shape: _Shape, include_usage: bool):
    """The SSE body: chunks, the finish chunk, the usage chunk, `[DONE]`.

    Progress becomes an SSE comment (clients ignore it; it keeps proxies from
    timing out a long prefill). Closing this generator early, as Starlette does
    when the client disconnects, cancels the gRPC call.
    """
    try:
        for chunk in shape.head():
            yield _sse(chunk)
        event = first
        while event is not None:
            if isinstance(event, Progress):
                yield f": prefill {event.done}/{event.total}\n\n"
            elif isinstance(event, Chunk):
                for chunk in shape.delta(event.text):
                    yield _sse(chunk)
            elif isinstance(event, Final) and event.finish_reason != "error":  # else: error next
                for chunk in shape.finish(event):
                    yield _sse(chunk)
                if include_usage:
                    yield _sse(shape.usage_chunk(event))
            event = await anext(stream, None)
    except LineageError as error:
        yield _sse(_lineage_error(error)[1])
    finally:
        stream.cancel()
    yield "data: [DONE]\n\n"


# --------------------------------------------------------------- backend ----


class Backend:
    """The gRPC side: an AsyncClient, a health stub, and the served model's identity."""

    def __init__(self, grpc_address: str):
        self.address = grpc_address
        self.client = AsyncClient(grpc_address)
        self._info: dict | None = None

    async def model_info(self, auth_token: str | None = None) -> dict:
        """ModelInfo as {"id", "max_context", "fingerprint", "reply"}, fetched once."""
        if self._info is None:
            reply = await self.client.model_info(auth_token)
            self._info = {
                "id": PurePath(reply["model"]).name or reply["model"],
                "max_context": reply["max_context"],
                "fingerprint": reply["fingerprint"],
                "reply": reply,
            }
        return self._info

    async def health(self) -> str:
        """The grpc.health.v1 status name of the whole server, or the failed call's code."""
        import grpc
        from grpc_health.v1 import health_pb2

        stub = self.client._stubs()[1]  # the same channel (TLS included) as the calls
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5.0)
        except grpc.RpcError as error:
            return error.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    async def close(self) -> None:
        await self.client.close()


async def _unless_disconnected(request, awaitable):
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


def _sampling(body, info: dict, namespace: str, rid: str, token: str | None = None) -> dict:
    """The OpenAI sampling fields -> keyword arguments of AsyncClient.stream."""
    if body.n not in (None, 1):
        raise InvalidInput(f"n must be 1 (one choice per request), got {body.n}")
    max_tokens = getattr(body, "max_completion_tokens", None)
    max_tokens = max_tokens if max_tokens is not None else body.max_tokens
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    return {
        # No limit given: the context (the engine clips it to the room left).
        "max_tokens": info["max_context"] if max_tokens is None else max_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,  # OpenAI's default
        "top_p": body.top_p or 0.0,
        "top_k": body.top_k or 0,
        "seed": body.seed,
        "stop": stop,
        "namespace": namespace,
        "request_id": rid,
        "auth_token": token,
    }


async def _respond(request, body, stream, shape: _Shape):
    """A whole JSON response, or SSE once the first event shows the request was accepted."""
    from fastapi.responses import StreamingResponse
    from starlette.background import BackgroundTask

    if not body.stream:
        return shape.whole(await _unless_disconnected(request, stream.result()))
    # Waiting for the first event turns an INVALID_ARGUMENT into a 400, not an SSE error.
    first = await _unless_disconnected(request, anext(stream, None))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = _events_as_sse(first, stream, shape, include_usage)
    # On a disconnect Starlette cancels the sending task and then runs the
    # background task: closing the generator there cancels the gRPC call even when
    # the cancel landed outside the generator (in send).
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(events.aclose),
    )


# ------------------------------------------------------------------- app ----


def _schemas() -> SimpleNamespace:
    """The request bodies (pydantic). Unknown fields are accepted and ignored."""
    from pydantic import BaseModel, ConfigDict

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")

    class Function(Open):
        name: str
        arguments: str | dict = "{}"

    class ToolCall(Open):
        id: str | None = None
        type: str = "function"
        function: Function

    class Message(Open):
        role: str
        content: str | list[dict] | None = None
        tool_calls: list[ToolCall] | None = None
        tool_call_id: str | None = None
        name: str | None = None

    class StreamOptions(Open):
        include_usage: bool = False

    class Sampling(Open):
        model: str | None = None
        temperature: float | None = None
        top_p: float | None = None
        top_k: int | None = None
        max_tokens: int | None = None
        stop: str | list[str] | None = None
        seed: int | None = None
        n: int | None = None
        stream: bool = False
        stream_options: StreamOptions | None = None
        user: str | None = None

    class Chat(Sampling):
        messages: list[Message]
        tools: list[dict] | None = None
        tool_choice: str | dict | None = None
        max_completion_tokens: int | None = None

    class Completion(Sampling):
        prompt: str | list[int] | list[str]

    return SimpleNamespace(Chat=Chat, Completion=Completion)


def _add_error_handlers(app) -> None:
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
        status, body = _lineage_error(error)
        return JSONResponse(body, status)

    @app.exception_handler(ClientDisconnected)
    async def client_gone(request, error):
        return Response(status_code=499)

    @app.exception_handler(HTTPException)
    async def http_error(request, error):
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(error.detail), kind), error.status_code)


def create_app(grpc_address: str, security: BridgeSecurity | None = None):
    """The FastAPI app, a client of the engine at `grpc_address`; app.state.backend.

    A caller's bearer token goes on to the engine with its calls, so the engine
    decides the namespace; with `security.tokens` the bridge also refuses
    unknown tokens itself (401) before it answers anything.
    """
    security = security or BridgeSecurity()
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    s = _schemas()
    backend = Backend(grpc_address)
    app = FastAPI(title="lineage OpenAI-compatible bridge", docs_url=None, redoc_url=None)
    app.state.backend = backend
    _add_error_handlers(app)
    app.add_middleware(BodyLimit, limit=security.max_body_bytes)
    if security.tokens:
        app.add_middleware(BearerAuth, tokens=security.tokens)  # outermost: runs first

    def namespace(request: Request, body) -> str:
        return request.headers.get("x-cache-namespace") or body.user or ""

    @app.post("/v1/chat/completions")
    async def chat_completions(body: s.Chat, request: Request):
        token = bearer_token(request.headers)
        info, rid = await backend.model_info(token), uuid.uuid4().hex
        kwargs = _sampling(body, info, namespace(request, body), rid, token)
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        for m in messages:  # OpenAI's newer name for the system role
            m["role"] = "system" if m["role"] == "developer" else m["role"]
        stream = backend.client.stream(messages=messages, tools=body.tools, **kwargs)
        parse_tools = bool(body.tools) and body.tool_choice != "none"
        return await _respond(request, body, stream, ChatShape(rid, info, parse_tools))

    @app.post("/v1/completions")
    async def completions(body: s.Completion, request: Request):
        token = bearer_token(request.headers)
        info, rid = await backend.model_info(token), uuid.uuid4().hex
        kwargs = _sampling(body, info, namespace(request, body), rid, token)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            stream = backend.client.stream(prompt_ids=prompt, **kwargs)
        else:
            if isinstance(prompt, list):
                if len(prompt) != 1:
                    raise InvalidInput(f"prompt: one prompt per request, got {len(prompt)}")
                prompt = prompt[0]
            stream = backend.client.stream(prompt=prompt, **kwargs)
        return await _respond(request, body, stream, TextShape(rid, info))

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


def add_arguments(parser) -> None:
    """`lineage bridge` flags (the CLI fills --server from $LINEAGE_SERVER)."""
    parser.add_argument(
        "--server",
        metavar="HOST:PORT",
        help=f"engine address (default: $LINEAGE_SERVER or {DEFAULT_SERVER})",
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default: 8000)")
    from clients.cli import add_security_arguments

    add_security_arguments(parser)
    from clients.cli import add_limit_arguments

    add_limit_arguments(parser, only=("max_body_bytes",))


def run(args) -> int:
    """`lineage bridge`: the CLI plug-in entry point."""
    import os

    from clients.cli import SECURITY_FLAGS, UsageError
    from engine.config import EngineConfig, ServerConfig

    flags = {name: getattr(args, name, None) for name in (*SECURITY_FLAGS, "max_body_bytes")}
    try:
        config = EngineConfig.from_sources(flags, os.environ)
        server = config.server
        gate = ServerConfig(host=args.host, tokens=server.tokens, insecure=server.insecure)
        gate.check_exposure()
    except (ValueError, OSError) as error:
        raise UsageError(str(error))
    security = bridge_security(server, config.limits)
    return run_bridge(args.server or DEFAULT_SERVER, args.host, args.port, security)
