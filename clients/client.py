"""Python client for the lineage engine's gRPC API, sync and asyncio.

Knows the wire format (engine/proto) and OpenAI-shaped chat messages and tools;
knows nothing about models, caches or Ray. Imports grpc and the generated code
only, so a client process never loads MLX.

    client = Client("127.0.0.1:50051")
    result = client.generate(messages=[{"role": "user", "content": "hi"}], max_tokens=32)
    for event in client.stream(prompt="Once", max_tokens=8):
        ...  # Progress | Chunk | Final

Every gRPC failure surfaces as `LineageError(code, message)`; bad arguments
raise `ValueError` before anything is sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence, Union

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.proto import engine_pb2, engine_pb2_grpc

DEFAULT_SERVER = "127.0.0.1:50051"
DEFAULT_MAX_TOKENS = 256
ENGINE_SERVICE = "lineage.v1.Engine"
# Health-check answers that mean "not yet": keep polling until the deadline.
_NOT_READY_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.NOT_FOUND,
)


class LineageError(Exception):
    """A failed call: `code` is the gRPC status name (e.g. "INVALID_ARGUMENT")."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> "LineageError":
        """Wrap a grpc.RpcError (sync or aio) keeping its code name and details."""
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else None
        return cls(code.name if code is not None else "UNKNOWN", details or str(error))


# ---------------------------------------------------------------- events ----


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Restore:
    kind: str = "none"  # entry, guard, final, anchor, divergence, reply, none
    length: int = 0


@dataclass(frozen=True)
class Timing:
    queue_ms: float = 0.0
    plan_ms: float = 0.0
    restore_ms: float = 0.0
    prefill_ms: float = 0.0
    commit_ms: float = 0.0
    ttft_ms: float = 0.0
    decode_tps: float = 0.0
    bytes_copied_restore: int = 0
    bytes_copied_commit: int = 0
    restored_kv_bytes: int = 0


_JSON_TIMING = ("queue_ms", "plan_ms", "restore_ms", "prefill_ms", "commit_ms", "ttft_ms",
                "decode_tps")


@dataclass(frozen=True)
class Progress:
    """Prefill progress of a long prompt: `done` of `total` prompt tokens."""

    done: int
    total: int


@dataclass(frozen=True)
class Chunk:
    """Newly generated tokens and their text."""

    ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class Final:
    """The last event of a stream."""

    finish_reason: str  # stop | length | cancelled | error
    usage: Usage
    restore: Restore
    timing: Timing
    request_id: str


Event = Union[Progress, Chunk, Final]


@dataclass(frozen=True)
class Result:
    """A whole response: the chunks joined, plus the final event's fields."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    restore: Restore = field(default_factory=Restore)
    timing: Timing = field(default_factory=Timing)
    request_id: str = ""

    def to_json_dict(self) -> dict:
        """The stable JSON shape printed by `lineage generate --json`."""
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "usage": {
                "prompt_tokens": self.usage.prompt_tokens,
                "cached_tokens": self.usage.cached_tokens,
                "completion_tokens": self.usage.completion_tokens,
            },
            "restore": {"kind": self.restore.kind, "length": self.restore.length},
            "timing": {name: getattr(self.timing, name) for name in _JSON_TIMING},
        }


def event_from_proto(event: engine_pb2.GenerateEvent) -> Event:
    """GenerateEvent -> Progress | Chunk | Final. Raises ValueError on an empty event."""
    which = event.WhichOneof("event")
    if which == "progress":
        return Progress(done=event.progress.done, total=event.progress.total)
    if which == "chunk":
        return Chunk(ids=tuple(event.chunk.ids), text=event.chunk.text)
    if which == "final":
        f = event.final
        return Final(
            finish_reason=f.finish_reason,
            usage=Usage(f.usage.prompt_tokens, f.usage.cached_tokens, f.usage.completion_tokens),
            restore=Restore(kind=f.restore.kind or "none", length=f.restore.length),
            timing=Timing(**{k: getattr(f.timing, k) for k in Timing.__dataclass_fields__}),
            request_id=f.request_id,
        )
    raise ValueError(f"generate event with no payload: {event!r}")


class _Collector:
    """Accumulates a stream's events into a Result."""

    def __init__(self):
        self.texts: list[str] = []
        self.ids: list[int] = []
        self.final: Final | None = None

    def add(self, event: Event) -> None:
        if isinstance(event, Chunk):
            self.texts.append(event.text)
            self.ids.extend(event.ids)
        elif isinstance(event, Final):
            self.final = event

    def result(self) -> Result:
        if self.final is None:
            raise LineageError("INTERNAL", "the stream ended without a final event")
        f = self.final
        return Result("".join(self.texts), tuple(self.ids), f.finish_reason, f.usage,
                      f.restore, f.timing, f.request_id)


# --------------------------------------------------------------- requests ----


def _content_text(content: Any, where: str) -> str:
    """OpenAI content (str, None, or a list of text parts) -> text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                raise ValueError(f"{where}: only text content parts are supported, got {part!r}")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ValueError(f"{where}: content must be a string or a list of text parts")


def tool_call_to_proto(call: Mapping[str, Any], where: str = "tool call") -> engine_pb2.ToolCall:
    """OpenAI {"id", "type": "function", "function": {"name", "arguments"}} -> ToolCall.

    A flat {"id", "name", "arguments"} is accepted too; non-string arguments are
    JSON-encoded.
    """
    if not isinstance(call, Mapping):
        raise ValueError(f"{where} must be a dict, got {call!r}")
    fn = call.get("function", call)
    if not isinstance(fn, Mapping) or not fn.get("name"):
        raise ValueError(f"{where} has no function name: {call!r}")
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return engine_pb2.ToolCall(id=str(call.get("id") or ""), name=str(fn["name"]), arguments=args)


def message_to_proto(message: Mapping[str, Any], index: int = 0) -> engine_pb2.Message:
    """One {role, content, tool_calls?, tool_call_id?, name?} dict -> Message."""
    where = f"messages[{index}]"
    if not isinstance(message, Mapping) or not message.get("role"):
        raise ValueError(f"{where} must be a dict with a role, got {message!r}")
    calls = message.get("tool_calls") or []
    return engine_pb2.Message(
        role=str(message["role"]),
        content=_content_text(message.get("content"), where),
        tool_calls=[tool_call_to_proto(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)],
        tool_call_id=str(message.get("tool_call_id") or ""),
        name=str(message.get("name") or ""),
    )


def tools_to_json(tools: Sequence[Mapping[str, Any]] | None) -> str:
    """A list of tool definitions (OpenAI style) -> tools_json text; None or [] -> ""."""
    if not tools:
        return ""
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
        raise ValueError(f"tools must be a list of dicts, got {type(tools).__name__}")
    return json.dumps(list(tools), ensure_ascii=False)


def build_request(
    messages: Sequence[Mapping[str, Any]] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    prompt: str | None = None,
    prompt_ids: Iterable[int] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    top_p: float = 0.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    namespace: str = "",
    request_id: str = "",
    continue_final_message: bool = False,
) -> engine_pb2.GenerateRequest:
    """Arguments of generate()/stream() -> GenerateRequest.

    Exactly one of messages, prompt, prompt_ids; tools only with messages;
    max_tokens > 0. Raises ValueError naming the bad argument.
    """
    given = [n for n, v in (("messages", messages), ("prompt", prompt),
                            ("prompt_ids", prompt_ids)) if v is not None]
    if len(given) != 1:
        got = ", ".join(given) or "none"
        raise ValueError(f"give exactly one of messages, prompt, prompt_ids (got {got})")
    if tools and messages is None:
        raise ValueError("tools need messages (they are rendered by the chat template)")
    if int(max_tokens) <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    if isinstance(stop, str):
        stop = [stop]
    sampling = engine_pb2.Sampling(
        temperature=float(temperature), top_p=float(top_p), top_k=int(top_k),
        max_tokens=int(max_tokens), stop=list(stop or []),
        stop_token_ids=[int(t) for t in stop_token_ids or []],
    )
    if seed is not None:
        sampling.seed = int(seed)
    request = engine_pb2.GenerateRequest(request_id=request_id, namespace=namespace,
                                         sampling=sampling)
    if messages is not None:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ValueError("messages must be a list of dicts")
        if not messages:
            raise ValueError("messages is empty")
        request.messages.extend(message_to_proto(m, i) for i, m in enumerate(messages))
        request.tools_json = tools_to_json(tools)
        request.add_generation_prompt = not continue_final_message
        request.continue_final_message = continue_final_message
    elif prompt is not None:
        request.prompt_text = str(prompt)
    else:
        request.prompt_ids.CopyFrom(engine_pb2.TokenIds(ids=[int(t) for t in prompt_ids]))
    return request


def message_to_dict(message) -> dict:
    """A proto message -> plain dict with every field (ints stay ints, maps become dicts)."""
    out = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            out[f.name] = dict(value)
        elif f.is_repeated:
            out[f.name] = [message_to_dict(v) if f.message_type else v for v in value]
        elif f.message_type is not None:
            out[f.name] = message_to_dict(value)
        else:
            out[f.name] = value
    return out


class _HealthPoll:
    """wait_ready's schedule, shared by both clients: Check until SERVING or the deadline."""

    def __init__(self, server: str, timeout: float, service: str):
        self.server, self.timeout = server, timeout
        self.request = health_pb2.HealthCheckRequest(service=service)
        self.deadline = time.monotonic() + timeout
        self.delay, self.last = 0.05, "no answer"

    def check_timeout(self) -> float:
        return max(min(self.deadline - time.monotonic(), 5.0), 0.05)

    def serving(self, reply: health_pb2.HealthCheckResponse) -> bool:
        self.last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def failed(self, error: grpc.RpcError) -> None:
        """Record a "not yet" answer; raise LineageError for any other failure."""
        if error.code() not in _NOT_READY_CODES:
            raise LineageError.from_rpc(error) from None
        self.last = error.code().name

    def pause(self) -> float:
        """Seconds to wait before the next Check; LineageError once the deadline passed."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise LineageError("DEADLINE_EXCEEDED",
                               f"{self.server} not ready after {self.timeout:g}s ({self.last})")
        delay, self.delay = min(self.delay, remaining), min(self.delay * 2, 0.5)
        return delay


class _Call:
    """What both stream kinds share: the call, the collected events, cancel state."""

    def __init__(self, call):
        self._call = call
        self._collector = _Collector()
        self._cancelled = False
        self._done = False

    def _event(self, message: engine_pb2.GenerateEvent) -> Event:
        event = event_from_proto(message)
        self._collector.add(event)
        return event

    def _end(self, error: grpc.RpcError) -> None:
        """The call failed: return quietly if we cancelled it, else raise LineageError."""
        self._done = True
        if not (self._cancelled and error.code() == grpc.StatusCode.CANCELLED):
            raise LineageError.from_rpc(error) from None

    def cancel(self) -> None:
        """Cancel the call; the server frees the request's batch slot."""
        if not self._done:
            self._cancelled = True
            self._call.cancel()

    def __del__(self):
        if not getattr(self, "_done", True):
            self._call.cancel()


# ------------------------------------------------------------------- sync ----


class Stream(_Call):
    """A running Generate call: iterate it for events; cancel() stops it.

    Leaving a `for` loop over it early (break, exception), close(), leaving a
    `with` block, or dropping the object cancels the call on the server.
    After a local cancel, iteration simply ends.
    """

    def _next_event(self) -> Event | None:
        if self._done:
            return None
        try:
            return self._event(next(self._call))
        except StopIteration:
            self._done = True
        except grpc.RpcError as error:
            self._end(error)
        return None

    def __next__(self) -> Event:
        event = self._next_event()
        if event is None:
            raise StopIteration
        return event

    def __iter__(self) -> Iterator[Event]:
        # A generator of its own, so that a loop that stops early closes it and
        # the finally clause cancels the call at once.
        try:
            while (event := self._next_event()) is not None:
                yield event
        finally:
            self.cancel()

    close = _Call.cancel

    def result(self) -> Result:
        """Drain the remaining events and return the whole Result."""
        try:
            while self._next_event() is not None:
                pass
        finally:
            self.cancel()
        return self._collector.result()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class Client:
    """Blocking client over one channel to `server` ("host:port").

    `timeout` is the deadline (seconds) of the unary calls; streams have none.
    """

    def __init__(self, server: str = DEFAULT_SERVER, *, timeout: float | None = 30.0,
                 options: Sequence[tuple[str, Any]] = ()):
        self.server = server
        self.timeout = timeout
        self._channel = grpc.insecure_channel(server, options=list(options))
        self._engine = engine_pb2_grpc.EngineStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def stream(self, messages=None, tools=None, prompt=None, prompt_ids=None,
               max_tokens: int = DEFAULT_MAX_TOKENS, **kwargs) -> Stream:
        """Start a Generate call; see build_request for the arguments."""
        request = build_request(messages, tools, prompt, prompt_ids, max_tokens, **kwargs)
        return Stream(self._engine.Generate(request))

    def generate(self, messages=None, tools=None, prompt=None, prompt_ids=None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, **kwargs) -> Result:
        """Run one request to the end and return its Result."""
        return self.stream(messages, tools, prompt, prompt_ids, max_tokens, **kwargs).result()

    def _unary(self, method, request):
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise LineageError.from_rpc(error) from None

    def cache_stats(self) -> dict:
        """The CacheStats RPC as a dict of its fields."""
        return message_to_dict(self._unary(self._engine.CacheStats, engine_pb2.CacheStatsRequest()))

    def model_info(self) -> dict:
        """The ModelInfo RPC as a dict of its fields."""
        return message_to_dict(self._unary(self._engine.ModelInfo, engine_pb2.ModelInfoRequest()))

    def wait_ready(self, timeout: float = 30.0, service: str = "") -> None:
        """Poll grpc.health.v1 until `service` ("" or "lineage.v1.Engine") is SERVING.

        Raises LineageError("DEADLINE_EXCEEDED") after `timeout` seconds.
        """
        poll = _HealthPoll(self.server, timeout, service)
        while True:
            try:
                if poll.serving(self._health.Check(poll.request, timeout=poll.check_timeout())):
                    return
            except grpc.RpcError as error:
                poll.failed(error)
            time.sleep(poll.pause())

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------- asyncio ----


def _task_is_cancelling() -> bool:
    task = asyncio.current_task()
    return bool(task is not None and getattr(task, "cancelling", lambda: 0)())


class AsyncStream(_Call):
    """A running Generate call for asyncio: `async for event in stream`.

    Cancelling the task that awaits it cancels the call; so do cancel(),
    aclose() and leaving an `async with` block. After a local cancel(),
    iteration simply ends.
    """

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> Event:
        if self._done:
            raise StopAsyncIteration
        try:
            message = await self._call.read()
        except asyncio.CancelledError:
            # grpc.aio raises CancelledError for a locally cancelled call too:
            # that ends the iteration; a cancelled task propagates.
            if self._cancelled and not _task_is_cancelling():
                self._done = True
                raise StopAsyncIteration from None
            self.cancel()
            raise
        except grpc.RpcError as error:
            self._end(error)
            raise StopAsyncIteration from None
        if message is grpc.aio.EOF:
            self._done = True
            raise StopAsyncIteration
        return self._event(message)

    async def aclose(self) -> None:
        self.cancel()

    async def result(self) -> Result:
        """Drain the remaining events and return the whole Result."""
        try:
            async for _ in self:
                pass
        finally:
            self.cancel()
        return self._collector.result()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc) -> None:
        self.cancel()


class AsyncClient:
    """asyncio client; the channel is opened on first use inside the running loop."""

    def __init__(self, server: str = DEFAULT_SERVER, *, timeout: float | None = 30.0,
                 options: Sequence[tuple[str, Any]] = ()):
        self.server = server
        self.timeout = timeout
        self._options = list(options)
        self._channel = None

    def _stubs(self):
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.server, options=self._options)
            self._engine = engine_pb2_grpc.EngineStub(self._channel)
            self._health = health_pb2_grpc.HealthStub(self._channel)
        return self._engine, self._health

    def stream(self, messages=None, tools=None, prompt=None, prompt_ids=None,
               max_tokens: int = DEFAULT_MAX_TOKENS, **kwargs) -> AsyncStream:
        """Start a Generate call (call it inside the event loop); see build_request."""
        request = build_request(messages, tools, prompt, prompt_ids, max_tokens, **kwargs)
        return AsyncStream(self._stubs()[0].Generate(request))

    async def generate(self, messages=None, tools=None, prompt=None, prompt_ids=None,
                       max_tokens: int = DEFAULT_MAX_TOKENS, **kwargs) -> Result:
        """Run one request to the end and return its Result."""
        return await self.stream(messages, tools, prompt, prompt_ids, max_tokens,
                                 **kwargs).result()

    async def _unary(self, name: str, request):
        try:
            return await getattr(self._stubs()[0], name)(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise LineageError.from_rpc(error) from None

    async def cache_stats(self) -> dict:
        """The CacheStats RPC as a dict of its fields."""
        return message_to_dict(await self._unary("CacheStats", engine_pb2.CacheStatsRequest()))

    async def model_info(self) -> dict:
        """The ModelInfo RPC as a dict of its fields."""
        return message_to_dict(await self._unary("ModelInfo", engine_pb2.ModelInfoRequest()))

    async def wait_ready(self, timeout: float = 30.0, service: str = "") -> None:
        """Poll grpc.health.v1 until `service` is SERVING; LineageError after `timeout` s."""
        health = self._stubs()[1]
        poll = _HealthPoll(self.server, timeout, service)
        while True:
            try:
                if poll.serving(await health.Check(poll.request, timeout=poll.check_timeout())):
                    return
            except grpc.RpcError as error:
                poll.failed(error)
            await asyncio.sleep(poll.pause())

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
