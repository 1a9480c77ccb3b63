"""Python client for the lineage engine's gRPC API, sync and asyncio.

Knows the wire format (engine/proto) and OpenAI-shaped chat messages and tools;
knows nothing about models, caches or Ray. Imports grpc and the generated code
only, so a client process never loads MLX.

    client = Client("127.0.0.1:50051")
    result = client.generate(messages=[{"role": "user", "content": "hi"}], max_tokens=32)
    for event in client.stream(prompt="Once", max_tokens=8):
        ...  # Progress | Chunk | Final

A request may name its conversation (`session=`: an agent's session id): with
several replicas, its turns go to the one that served it last, load permitting.
`model_info()["output_format"]` says how the model marks reasoning and tool
calls in its output (clients.bridge.parsers reads them).

Every gRPC failure surfaces as `LineageError(code, message)`; bad arguments
raise `ValueError` before anything is sent. A client sends `auth_token` (else
$LINEAGE_AUTH_TOKEN) as a bearer token, and speaks TLS when given a CA or a
client certificate (else $LINEAGE_TLS_CA, $LINEAGE_TLS_CLIENT_CERT/_KEY), or
`tls=True` for the system's roots (clients.channel). An `AsyncClient(...,
on_behalf=True)` calls for others (the bridge): it has no token of its own,
not even the environment's, and each call sends the one it is given, or none.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.channel import Security, channel
from clients.wire import (  # noqa: F401  (re-exported: the client's public types)
    DEFAULT_MAX_TOKENS,
    Chunk,
    Event,
    Final,
    LineageError,
    Progress,
    Restore,
    Result,
    ResultCollector,
    Timing,
    TokenLogprob,
    Usage,
    build_request,
    event_from_proto,
    message_to_dict,
    message_to_proto,
    tool_call_to_proto,
    tools_to_json,
)
from engine.proto import engine_pb2, engine_pb2_grpc

DEFAULT_SERVER = "127.0.0.1:50051"
ENGINE_SERVICE = "lineage.v1.Engine"
# Health-check answers that mean "not yet": keep polling until the deadline.
_NOT_READY_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.NOT_FOUND,
)


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
            raise LineageError(
                "DEADLINE_EXCEEDED",
                f"{self.server} not ready after {self.timeout:g}s ({self.last})",
            )
        delay, self.delay = min(self.delay, remaining), min(self.delay * 2, 0.5)
        return delay


class _Call:
    """What both stream kinds share: the call, the collected events, cancel state."""

    def __init__(self, call):
        self._call = call
        self._collector = ResultCollector()
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

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        *,
        timeout: float | None = 30.0,
        options: Sequence[tuple[str, Any]] = (),
        auth_token: str | None = None,
        tls: bool | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ):
        self.server = server
        self.timeout = timeout
        self.security = Security.from_env(auth_token, tls, tls_ca, tls_cert, tls_key)
        self._metadata = self.security.metadata
        self._channel = channel(server, self.security, options, aio=False)
        self._engine = engine_pb2_grpc.EngineStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def stream(
        self,
        messages=None,
        tools=None,
        prompt=None,
        prompt_ids=None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        auth_token: str | None = None,
        **kwargs,
    ) -> Stream:
        """Start a Generate call; see build_request for the arguments.

        `auth_token` replaces the client's token for this call.
        """
        request = build_request(messages, tools, prompt, prompt_ids, max_tokens, **kwargs)
        metadata = Security(auth_token).metadata if auth_token else self._metadata
        return Stream(self._engine.Generate(request, metadata=metadata))

    def generate(
        self,
        messages=None,
        tools=None,
        prompt=None,
        prompt_ids=None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        **kwargs,
    ) -> Result:
        """Run one request to the end and return its Result."""
        return self.stream(messages, tools, prompt, prompt_ids, max_tokens, **kwargs).result()

    def _unary(self, method, request, timeout: float | None = None):
        """`method`'s call within `timeout` s (None: the client's own deadline)."""
        timeout = self.timeout if timeout is None else timeout
        try:
            return method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise LineageError.from_rpc(error) from None

    def cache_stats(self) -> dict:
        """The CacheStats RPC as a dict of its fields."""
        return message_to_dict(self._unary(self._engine.CacheStats, engine_pb2.CacheStatsRequest()))

    def model_info(self) -> dict:
        """The ModelInfo RPC as a dict of its fields."""
        return message_to_dict(self._unary(self._engine.ModelInfo, engine_pb2.ModelInfoRequest()))

    def inspect(self, recent: int = 20, model: str = "", timeout: float | None = None) -> dict:
        """The Inspect RPC (live figures, the latest `recent` requests; `model`: that
        model's, when the server serves several) as a dict; `timeout`: this call's deadline
        in s, where not the client's (it waits for every replica's figures)."""
        request = engine_pb2.InspectRequest(recent=recent, model=model)
        return message_to_dict(self._unary(self._engine.Inspect, request, timeout))

    def wait_ready(self, timeout: float = 30.0, service: str = "") -> None:
        """Poll grpc.health.v1 until `service` ("" or "lineage.v1.Engine") is SERVING.

        Raises LineageError("DEADLINE_EXCEEDED") after `timeout` seconds.
        """
        poll = _HealthPoll(self.server, timeout, service)
        while True:
            try:
                reply = self._health.Check(
                    poll.request, timeout=poll.check_timeout(), metadata=self._metadata
                )
                if poll.serving(reply):
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
    """asyncio client; the channel is opened on first use inside the running loop.

    `on_behalf`: it calls for others, so it sends no token but the one each call gives.
    """

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        *,
        timeout: float | None = 30.0,
        options: Sequence[tuple[str, Any]] = (),
        auth_token: str | None = None,
        tls: bool | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        on_behalf: bool = False,
    ):
        if on_behalf and auth_token:
            raise ValueError("a client that calls on behalf of others has no token of its own")
        self.server = server
        self.timeout = timeout
        self.security = Security.from_env(
            auth_token, tls, tls_ca, tls_cert, tls_key, env_token=not on_behalf
        )
        self._metadata = self.security.metadata
        self._options = list(options)
        self._channel = None

    def _stubs(self):
        if self._channel is None:
            self._channel = channel(self.server, self.security, self._options, aio=True)
            self._engine = engine_pb2_grpc.EngineStub(self._channel)
            self._health = health_pb2_grpc.HealthStub(self._channel)
        return self._engine, self._health

    def stream(
        self,
        messages=None,
        tools=None,
        prompt=None,
        prompt_ids=None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        auth_token: str | None = None,
        **kwargs,
    ) -> AsyncStream:
        """Start a Generate call (call it inside the event loop); see build_request.

        `auth_token` replaces the client's token for this call.
        """
        request = build_request(messages, tools, prompt, prompt_ids, max_tokens, **kwargs)
        metadata = Security(auth_token).metadata if auth_token else self._metadata
        return AsyncStream(self._stubs()[0].Generate(request, metadata=metadata))

    async def generate(
        self,
        messages=None,
        tools=None,
        prompt=None,
        prompt_ids=None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        **kwargs,
    ) -> Result:
        """Run one request to the end and return its Result."""
        return await self.stream(messages, tools, prompt, prompt_ids, max_tokens, **kwargs).result()

    async def _unary(self, name: str, request, auth_token: str | None = None):
        metadata = Security(auth_token).metadata if auth_token else self._metadata
        try:
            method = getattr(self._stubs()[0], name)
            return await method(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as error:
            raise LineageError.from_rpc(error) from None

    async def cache_stats(self) -> dict:
        """The CacheStats RPC as a dict of its fields."""
        return message_to_dict(await self._unary("CacheStats", engine_pb2.CacheStatsRequest()))

    async def cache_tree(
        self, auth_token: str | None = None, namespace: str | None = None, recent: int = 50
    ) -> dict:
        """The CacheTree RPC (the cache page's tree, latest requests and memory shares) as a
        dict; `namespace`: one namespace of an admin's view (None: all)."""
        request = engine_pb2.CacheTreeRequest(recent=recent)
        if namespace is not None:
            request.namespace = namespace
        return message_to_dict(await self._unary("CacheTree", request, auth_token))

    async def model_info(self, auth_token: str | None = None) -> dict:
        """The ModelInfo RPC as a dict of its fields."""
        request = engine_pb2.ModelInfoRequest()
        return message_to_dict(await self._unary("ModelInfo", request, auth_token))

    async def wait_ready(self, timeout: float = 30.0, service: str = "") -> None:
        """Poll grpc.health.v1 until `service` is SERVING; LineageError after `timeout` s."""
        health = self._stubs()[1]
        poll = _HealthPoll(self.server, timeout, service)
        while True:
            try:
                reply = await health.Check(
                    poll.request, timeout=poll.check_timeout(), metadata=self._metadata
                )
                if poll.serving(reply):
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
