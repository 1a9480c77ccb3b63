"""Health checks beside the Engine service, and the slots of the Engine's calls.

`HealthGate` serves grpc.health.v1 over the `HealthServicer` that holds the
statuses (the supervisor sets them): `Check` answers anyone at once; a `Watch`
stream needs a token when tokens are on (engine.server.security.auth), at most
`health_watchers` stream at once (more: RESOURCE_EXHAUSTED) and each ends, OK,
after `health_watch_seconds` (the client watches again). `EngineSlots` caps
the Engine's calls at once (RESOURCE_EXHAUSTED past the cap) and counts
nothing else: gRPC's own cap (`maximum_concurrent_rpcs`) counted every call,
so Watch streams, which never end on their own, could take every slot. It
knows gRPC; nothing of the engine.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2_grpc


class HealthGate(health_pb2_grpc.HealthServicer):
    """grpc.health.v1 over `statuses`: Check open, Watch capped and ended after a while."""

    def __init__(self, statuses: health.aio.HealthServicer, watchers: int, watch_seconds: float):
        self.statuses = statuses
        self.watchers, self.watch_seconds = watchers, watch_seconds
        self.watching = 0

    async def Check(self, request, context):
        return await self.statuses.Check(request, context)

    async def Watch(self, request, context):
        if self.watching >= self.watchers:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.watching} health watches are open (the limit is {self.watchers}); "
                "use Check, or watch again later",
            )
        self.watching += 1
        try:
            async with asyncio.timeout(self.watch_seconds):
                await self.statuses.Watch(request, context)
        except TimeoutError:
            pass  # the stream ends OK; a client that still cares watches again
        finally:
            self.watching -= 1


class EngineSlots(grpc.aio.ServerInterceptor):
    """At most `limit` calls of `service` at once; past it, RESOURCE_EXHAUSTED."""

    def __init__(self, limit: int, service: str):
        self.limit, self.prefix = limit, f"/{service}/"
        self.busy = 0

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self.prefix):
            return handler
        return self._counted(handler)

    def _take(self) -> bool:
        if self.busy >= self.limit:
            return False
        self.busy += 1
        return True

    def _full(self) -> str:
        return f"{self.busy} calls are running (the limit is {self.limit}); retry later"

    def _counted(self, handler):
        """A handler of the same shape that holds a slot while the call runs."""
        kw = dict(
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            async def stream(request, context):
                if not self._take():
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._full())
                replies = inner_stream(request, context)
                try:
                    async for reply in replies:
                        yield reply
                finally:
                    self.busy -= 1
                    await replies.aclose()  # its cleanup (a cancel) runs now, not when collected

            return grpc.unary_stream_rpc_method_handler(stream, **kw)
        if handler.unary_unary:
            inner_unary = handler.unary_unary

            async def unary(request, context):
                if not self._take():
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._full())
                try:
                    return await inner_unary(request, context)
                finally:
                    self.busy -= 1

            return grpc.unary_unary_rpc_method_handler(unary, **kw)
        return handler  # the Engine has no client-streaming calls
