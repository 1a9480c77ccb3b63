"""The HTTP bridge's gate: request body size and bearer-token checks, as ASGI middleware.

Both run before FastAPI reads a byte of the body. A body over the limit is
answered 413, a missing or wrong token 401, each with an error body in the shape
of the path's wire format (clients.openai.errors). The token comes as
`Authorization: Bearer`, or as Anthropic's `x-api-key` when there is no
Authorization header. It knows HTTP and ASGI, and the body cap's setting;
nothing else of the engine.
"""

import hmac
import json
from dataclasses import dataclass, field

from clients.openai.errors import error_json, wire_of
from engine.config import Limits

# The default cap (--max-body-bytes): a 128k-token prompt as JSON token ids is ~1 MB.
MAX_BODY_BYTES = Limits.max_body_bytes
OPEN_PATHS = ("/health",)  # answered without a token (a load balancer's probe)


@dataclass(frozen=True)
class BridgeSecurity:
    """The bridge's own gate: known tokens (token -> identity), and TLS files."""

    tokens: dict = field(default_factory=dict)  # empty: no token needed
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # set: clients must present a certificate it signed
    max_body_bytes: int = MAX_BODY_BYTES  # larger bodies get 413

    def uvicorn_options(self) -> dict:
        if not self.tls_cert:
            return {}
        import ssl

        options = {"ssl_certfile": self.tls_cert, "ssl_keyfile": self.tls_key}
        if self.tls_client_ca:
            options.update(ssl_ca_certs=self.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
        return options


def bearer_token(headers) -> str | None:
    """The token of an `Authorization: Bearer` header (Starlette headers or a dict)."""
    value = headers.get("authorization") if headers is not None else None
    if not value or value[:7].lower() != "bearer ":
        return None
    return value[7:].strip() or None


def api_key(headers) -> str | None:
    """The caller's token: `Authorization: Bearer`, else Anthropic's `x-api-key` header."""
    token = bearer_token(headers)
    if token is None and headers is not None and headers.get("authorization") is None:
        token = (headers.get("x-api-key") or "").strip() or None
    return token


def _error(scope, status: int, message: str) -> tuple[int, bytes]:
    body = error_json(wire_of(scope.get("path") or ""), status, message)
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


class BodyLimit:
    """Refuse bodies over `limit` bytes with 413, by Content-Length or as they stream in.

    The body is read here (at most `limit` bytes held) and replayed to the app,
    so an oversized chunked upload is cut off before the app parses anything.
    """

    def __init__(self, app, limit: int = MAX_BODY_BYTES):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await _answer(send, *self._refusal(scope))
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                return await _answer(send, *self._refusal(scope))
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: a disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _refusal(self, scope) -> tuple[int, bytes]:
        return _error(scope, 413, f"the request body exceeds {self.limit} bytes")


class BearerAuth:
    """Answer 401 unless the caller's token (`Authorization: Bearer <token>`, or
    `x-api-key: <token>` without an Authorization header) names one of `tokens`.

    `tokens` maps a token to its identity (the cache namespace the bridge then
    uses); the identity lands in scope["state"]["identity"].
    """

    def __init__(self, app, tokens: dict[str, str], open_paths=OPEN_PATHS):
        self.app, self.tokens, self.open_paths = app, dict(tokens), tuple(open_paths)

    def identity(self, header: bytes | None, api_key: bytes | None = None) -> str | None:
        if header is None and api_key:
            header = b"Bearer " + api_key.strip()
        if not header or not header[:7].lower() == b"bearer ":
            return None
        given = header[7:].strip()
        found = None
        for token, who in self.tokens.items():  # compare every token in constant time
            if hmac.compare_digest(given, token.encode()):
                found = who
        return found

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.open_paths:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        who = self.identity(headers.get(b"authorization"), headers.get(b"x-api-key"))
        if who is None:
            status, body = _error(
                scope, 401, "missing or invalid bearer token (Authorization: Bearer ...)"
            )
            return await _answer(send, status, body, ((b"www-authenticate", b"Bearer"),))
        scope.setdefault("state", {})["identity"] = who
        return await self.app(scope, receive, send)
