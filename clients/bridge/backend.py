"""The bridge's engine side: calls made for a Caller, health, and the served model's identity.

Every call carries the token its Caller (clients.bridge.guard) came with, or
none: the AsyncClient calls on behalf of others and has no token of its own,
not even $LINEAGE_AUTH_TOKEN. The namespace it names is the Caller's
(`Caller.namespace`). It knows the gRPC client library; nothing of HTTP.
"""

from pathlib import PurePath

from clients.bridge.guard import Caller
from clients.client import AsyncClient, AsyncStream, LineageError


class Backend:
    """The gRPC side: an AsyncClient on behalf of callers, a health stub, the model's identity."""

    def __init__(self, grpc_address: str):
        self.address = grpc_address
        self.client = AsyncClient(grpc_address, on_behalf=True)
        self._info: dict | None = None

    def stream(self, caller: Caller, namespace: str = "", **request) -> AsyncStream:
        """A Generate call for `caller`, in the namespace it may use of the one it named."""
        namespace = caller.namespace(namespace)
        return self.client.stream(auth_token=caller.token, namespace=namespace, **request)

    async def model_info(self, caller: Caller, fresh: bool = False) -> dict:
        """ModelInfo as {"id", "max_context", "fingerprint", "output_format", "reply"}; asked
        once, unless `fresh` (then the engine checks this caller's token too)."""
        if self._info is None or fresh:
            reply = await self.client.model_info(caller.token)
            self._info = {
                "id": PurePath(reply["model"]).name or reply["model"],
                "max_context": reply["max_context"],
                "fingerprint": reply["fingerprint"],
                "output_format": reply.get("output_format") or "plain",
                "reply": reply,
            }
        return self._info

    async def cache_tree(self, caller: Caller, namespace: str | None, recent: int = 50) -> dict:
        """The CacheTree RPC for `caller` (the engine decides which namespaces it sees)."""
        return await self.client.cache_tree(caller.token, namespace, recent)

    async def checks_tokens(self) -> bool:
        """Whether the engine refuses a call without a token (UNAUTHENTICATED).

        LineageError for any other failure (an engine that does not answer).
        """
        try:
            await self.client.model_info(None)
        except LineageError as error:
            if error.code == "UNAUTHENTICATED":
                return True
            raise
        return False

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
