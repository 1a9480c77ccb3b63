"""The bridge's engine side: an AsyncClient, a health stub, and the served model's identity.

It knows the gRPC client library; nothing of HTTP.
"""

from pathlib import PurePath

from clients.client import AsyncClient


class Backend:
    """The gRPC side: an AsyncClient, a health stub, and the served model's identity."""

    def __init__(self, grpc_address: str):
        self.address = grpc_address
        self.client = AsyncClient(grpc_address)
        self._info: dict | None = None

    async def model_info(self, auth_token: str | None = None) -> dict:
        """ModelInfo as {"id", "max_context", "fingerprint", "output_format", "reply"}, fetched
        once."""
        if self._info is None:
            reply = await self.client.model_info(auth_token)
            self._info = {
                "id": PurePath(reply["model"]).name or reply["model"],
                "max_context": reply["max_context"],
                "fingerprint": reply["fingerprint"],
                "output_format": reply.get("output_format") or "plain",
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
