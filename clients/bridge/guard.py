"""The HTTP bridge's gate: who calls, and how much it may send, as ASGI middleware.

`CallerGate` runs first. It refuses a request that repeats `Authorization`,
`x-api-key` or `X-Cache-Namespace`, or gives both token headers with different
tokens (400: a bridge that read one copy and forwarded another once let a
tenant act as the admin), reads the one token (`Authorization: Bearer`, or
Anthropic's `x-api-key`), and, when the bridge holds tokens of its own,
refuses an unknown one (401). What it accepted
becomes the request's `Caller` (`caller_of(request)`): the token forwarded to
the engine, exactly that one and never another, the identity it names, and the
tenant they stand for (the response store's namespace). A route hands the
Caller to its backend call; with the bridge's own tokens a tenant's namespace
comes from its identity (`Identity.namespace_for`), as in
the engine. `BodyLimit` then reads the body, at most `max_body_bytes` (413)
within `body_deadline` seconds (408), before FastAPI parses a byte of it. Each
refusal's body has the shape of the path's wire format (clients.bridge.errors).
It knows HTTP, ASGI and the configuration's `Identity`; nothing else of the engine.
"""

import asyncio
import hashlib
import hmac
import json
from dataclasses import dataclass, field

from clients.bridge.errors import error_json, wire_of
from engine.config import Identity, Limits

# The default cap: the engine's own request cap (a 128k-token prompt as JSON ids is ~1 MB).
MAX_BODY_BYTES = Limits.max_request_bytes
# Answered without a token: a load balancer's probe, and the cache page's HTML (no data: its
# script asks /ui/tree with the token the operator types in).
OPEN_PATHS = ("/health", "/ui")
# a second copy is refused
SINGLE_HEADERS = (b"authorization", b"x-api-key", b"x-cache-namespace")


@dataclass(frozen=True)
class BridgeSecurity:
    """The bridge's gate and receive path: its tokens, TLS files, caps and deadlines."""

    identities: tuple[Identity, ...] = ()  # empty: the bridge checks no token (the engine may)
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # set: clients must present a certificate it signed
    max_body_bytes: int = MAX_BODY_BYTES  # larger bodies get 413
    header_deadline: float = 10.0  # seconds for a request's headers, else the connection closes
    body_deadline: float = 60.0  # seconds for its body, else 408
    keep_alive: float = 75.0  # seconds an idle kept connection stays open (then it closes)
    max_connections: int = 1024  # requests past it get 503; twice as many connections close
    allow_open_engine: bool = False  # tenants in front of an engine that checks no token

    @property
    def tenants(self) -> bool:
        return any(not i.admin for i in self.identities)

    def uvicorn_options(self) -> dict:
        if not self.tls_cert:
            return {}
        import ssl

        options = {"ssl_certfile": self.tls_cert, "ssl_keyfile": self.tls_key}
        if self.tls_client_ca:
            options.update(ssl_ca_certs=self.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
        return options


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, as the gate accepted it."""

    token: str | None = field(default=None, repr=False)  # forwarded as it is; None: no token
    identity: Identity | None = None  # the bridge's own tokens name it; None: the engine decides

    @property
    def tenant(self) -> str:
        """The tenant it stands for, the response store's namespace (never shown): the
        identity its token names, else a digest of the token, else "" (no tokens)."""
        if self.identity is not None:
            return "identity:" + self.identity.namespace
        if self.token is not None:
            return "token:" + hashlib.sha256(self.token.encode()).hexdigest()
        return ""

    def namespace(self, requested: str) -> str:
        """The namespace the backend call names: placed under the tenant's own when the
        bridge knows the identity (the engine, given the token, places it the same way)."""
        return self.identity.namespace_for(requested) if self.identity else requested


def caller_of(request) -> Caller:
    """The Caller the gate accepted for this request (a Starlette Request)."""
    return request.scope.get("state", {}).get("caller") or Caller()


def bearer_token(value: bytes | str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value; None for anything else."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not value or value[:7].lower() != "bearer ":
        return None
    return value[7:].strip() or None


def token_of(headers) -> str | None:
    """The token of a request's headers ((name, value) byte pairs): `Authorization: Bearer`,
    or Anthropic's `x-api-key` (the same one when both come)."""
    found = dict(headers)
    bearer = bearer_token(found.get(b"authorization"))
    key = (found.get(b"x-api-key") or b"").decode("latin-1").strip() or None
    return bearer or key


def _error(scope, status: int, message: str, param: str | None = None) -> tuple[int, bytes]:
    body = error_json(wire_of(scope.get("path") or ""), status, message, param)
    return status, json.dumps(body).encode()


async def _answer(send, status: int, body: bytes, headers: tuple = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class CallerGate:
    """Each request's Caller, or 400 (a repeated header) or 401 (a token the bridge does
    not know, when it holds tokens)."""

    def __init__(self, app, identities: tuple[Identity, ...] = (), open_paths=OPEN_PATHS):
        self.app, self.identities, self.open_paths = app, tuple(identities), tuple(open_paths)

    def identity(self, token: str | None) -> Identity | None:
        if token is None:
            return None
        given, found = token.encode(), None
        for ident in self.identities:  # compare every token in constant time
            if hmac.compare_digest(given, ident.token.encode()):
                found = ident
        return found

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or ()
        for name in SINGLE_HEADERS:
            if sum(1 for key, _ in headers if key == name) > 1:
                text = name.decode()
                message = f"send one {text} header, not several"
                return await _answer(send, *_error(scope, 400, message, text))
        given = dict(headers)
        bearer = bearer_token(given.get(b"authorization"))
        key = (given.get(b"x-api-key") or b"").decode("latin-1").strip() or None
        if bearer and key and not hmac.compare_digest(bearer.encode(), key.encode()):
            message = "send one token: Authorization and x-api-key differ"
            return await _answer(send, *_error(scope, 400, message, "x-api-key"))
        token = token_of(headers)
        caller = Caller(token)
        if self.identities:
            identity = self.identity(token)
            if identity is None and scope.get("path") not in self.open_paths:
                status, body = _error(
                    scope, 401, "missing or invalid bearer token (Authorization: Bearer ...)"
                )
                return await _answer(send, status, body, ((b"www-authenticate", b"Bearer"),))
            caller = Caller(token, identity)
        scope.setdefault("state", {})["caller"] = caller
        return await self.app(scope, receive, send)


class BodyLimit:
    """Read the body before the app: 413 past `limit` bytes (by Content-Length, or as it
    streams in), 408 when it has not all come within `deadline` seconds.

    The body is held here (at most `limit` bytes) and replayed to the app, so an
    oversized or slow upload is cut off before the app parses anything.
    """

    def __init__(self, app, limit: int = MAX_BODY_BYTES, deadline: float = 60.0):
        self.app, self.limit, self.deadline = app, limit, deadline

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await _answer(send, *self._too_large(scope))
        try:
            async with asyncio.timeout(self.deadline):
                body = await self._read(receive)
        except TimeoutError:
            status, text = _error(
                scope, 408, f"the request body did not arrive within {self.deadline:g} s"
            )
            return await _answer(send, status, text, ((b"connection", b"close"),))
        except _TooLarge:
            return await _answer(send, *self._too_large(scope))
        if body is None:  # the client went away
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: a disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive) -> bytes | None:
        """The whole body; None when the client went away; _TooLarge past the limit."""
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                raise _TooLarge
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self, scope) -> tuple[int, bytes]:
        return _error(scope, 413, f"the request body exceeds {self.limit} bytes")


class _TooLarge(Exception):
    """A body past the limit (answered 413)."""
