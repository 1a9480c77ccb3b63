"""Who is calling: bearer tokens, the gRPC interceptor that checks them, TLS credentials.

A token maps to an `Identity` (engine.config): its cache namespace, and whether
it is an admin. With tokens configured every call but the health check
(`Health/Check`; `Health/Watch` needs a token too) needs `authorization:
Bearer <token>` metadata, else UNAUTHENTICATED. A tenant's namespace comes
from its token, never from the request (`Identity.namespace_for`): a namespace
the request names becomes a sub-namespace of the tenant's (`tenant/sub`), so
no tenant reaches another's cache entries. An admin (the operator's token, or
a file entry marked `admin`) names any namespace, as every caller does when
authentication is off. It knows gRPC and the config; nothing of the engine.
"""

from __future__ import annotations

import hmac
from pathlib import Path

import grpc

from engine.config import Identity, ServerConfig

# A load balancer's probe answers without a token; a Watch stream stays open, so it
# needs one (engine.server.rpc.health caps them).
OPEN_METHODS = ("/grpc.health.v1.Health/Check",)
DENIED = "missing or invalid bearer token (send `authorization: Bearer <token>` metadata)"


class Authenticator:
    """Tokens to identities; constant-time comparison against every token."""

    def __init__(self, tokens: tuple[Identity, ...] = ()):
        self.tokens = tuple(tokens)

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def identity(self, metadata) -> Identity | None:
        """The caller's identity from gRPC metadata; None when absent or unknown."""
        header = next((v for k, v in metadata or () if k == "authorization"), None)
        if isinstance(header, bytes):
            header = header.decode("latin-1")
        if not header or header[:7].lower() != "bearer ":
            return None
        given = header[7:].strip().encode()
        found = None
        for ident in self.tokens:
            if hmac.compare_digest(given, ident.token.encode()):
                found = ident
        return found

    def namespace(self, identity: Identity | None, requested: str) -> str:
        """The cache namespace a request runs in."""
        if not self.enabled or identity is None:
            return requested
        return identity.namespace_for(requested)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for every call without a known bearer token (Health/Check stays open)."""

    def __init__(self, auth: Authenticator):
        self.auth = auth

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        if self.auth.identity(details.invocation_metadata) is not None:
            return handler
        return _denying(handler)


async def _deny(request, context):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)


async def _deny_stream(request, context):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)
    yield  # pragma: no cover  (abort raises)


def _denying(handler):
    """A handler of the same shape as `handler` that answers UNAUTHENTICATED."""
    kw = dict(
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(_deny_stream, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(_deny, **kw)
    if handler.stream_stream:
        return grpc.stream_stream_rpc_method_handler(_deny_stream, **kw)
    return grpc.unary_unary_rpc_method_handler(_deny, **kw)


def server_credentials(config: ServerConfig):
    """TLS credentials of the gRPC port (client certificates required when a client CA is set)."""
    key = Path(config.tls_key).read_bytes()
    cert = Path(config.tls_cert).read_bytes()
    ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )
