"""Who is calling the bridge, and the request to the engine every wire format makes.

`Caller` is the token that goes on to the engine (taken where chat completions
take it, so a change to how the bridge accepts tokens covers every endpoint),
the tenant it stands for (the identity the bridge's token check found, else a
digest of the token, else "" on a server without tokens), and the cache
namespace. `engine_call` gives the keyword arguments of `AsyncClient.stream`, `drain` runs a
whole (not streamed) request chunk by chunk.
It knows HTTP headers and the engine call; nothing of any wire's shapes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from clients.openai.guard import api_key
from clients.wire import session_key


@dataclass(frozen=True)
class Caller:
    token: str | None
    tenant: str  # the response store's namespace; never shown
    namespace: str  # the cache namespace asked for (the engine decides with the token)


def caller_of(request, namespace: str = "") -> Caller:
    """The caller of a Starlette request; `namespace` when no X-Cache-Namespace header."""
    token = api_key(request.headers)
    identity = request.scope.get("state", {}).get("identity")
    if identity is not None:
        tenant = "identity:" + identity
    elif token is not None:
        tenant = "token:" + hashlib.sha256(token.encode()).hexdigest()
    else:
        tenant = ""
    namespace = request.headers.get("x-cache-namespace") or namespace or ""
    return Caller(token, tenant, namespace)


def engine_call(
    caller: Caller,
    request_id: str,
    max_tokens: int,
    temperature: float | None,
    top_p: float | None = None,
    top_k: int | None = None,
    stop: list[str] | None = None,
    session: str | None = None,
) -> dict:
    """Keyword arguments of `AsyncClient.stream` (besides the prompt); `session` keeps a
    conversation on the replica that holds it (hashed when it is no identifier)."""
    return {
        "session": session_key(session),
        "max_tokens": max_tokens,
        "temperature": 1.0 if temperature is None else temperature,  # both wires' default
        "top_p": top_p or 0.0,
        "top_k": top_k or 0,
        "stop": stop or None,
        "namespace": caller.namespace,
        "request_id": request_id,
        "auth_token": caller.token,
    }


async def drain(stream, feed):
    """Run `stream` to its end, each chunk to `feed(text, ids)` (so a reply's reasoning
    tokens are counted as when it streams); its Final. A failure raises LineageError."""
    from clients.client import Chunk, Final, LineageError

    final = None
    try:
        async for event in stream:
            if isinstance(event, Chunk):
                feed(event.text, len(event.ids))
            elif isinstance(event, Final):
                final = event
    finally:
        stream.cancel()
    if final is None:
        raise LineageError("INTERNAL", "the stream ended without a final event")
    return final
