"""Who is calling the bridge, and the request to the engine every wire format makes.

`Caller` is what the gate accepted (clients.bridge.guard's Caller: the token
that goes on to the engine, exactly that one, and the identity the bridge's
own tokens name), the tenant it stands for (that identity, else a digest of
the token, else "" on a server without tokens: the response store's
namespace), and the cache namespace asked for. `engine_call` gives the keyword
arguments of the backend's `stream` (besides the Caller and the prompt),
`drain` runs a whole (not streamed) request chunk by chunk. It knows HTTP
headers and the engine call; nothing of any wire's shapes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from clients.bridge import guard
from clients.wire import session_key


@dataclass(frozen=True)
class Caller:
    gate: guard.Caller  # as the gate accepted it: what the backend calls are made for
    tenant: str  # the response store's namespace; never shown
    namespace: str  # the cache namespace asked for (placed under the tenant's own)


def caller_of(request, namespace: str = "") -> Caller:
    """The caller of a Starlette request; `namespace` when no X-Cache-Namespace header."""
    gate = guard.caller_of(request)
    if gate.identity is not None:
        tenant = "identity:" + gate.identity.namespace
    elif gate.token is not None:
        tenant = "token:" + hashlib.sha256(gate.token.encode()).hexdigest()
    else:
        tenant = ""
    namespace = request.headers.get("x-cache-namespace") or namespace or ""
    return Caller(gate, tenant, namespace)


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
    """Keyword arguments of the backend's `stream` (besides the Caller and the prompt);
    `session` keeps a conversation on the replica that holds it (hashed when it is no
    identifier)."""
    return {
        "session": session_key(session),
        "max_tokens": max_tokens,
        "temperature": 1.0 if temperature is None else temperature,  # both wires' default
        "top_p": top_p or 0.0,
        "top_k": top_k or 0,
        "stop": stop or None,
        "namespace": caller.namespace,
        "request_id": request_id,
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


EFFORTS = ("none", "minimal", "low", "medium", "high")


def thinking_switches(disabled: bool | None = None, effort: str | None = None) -> dict | None:
    """The chat templates' reasoning switches for a client's Anthropic `thinking` (its
    type: `disabled` or `enabled`) or Responses `reasoning.effort`: `enable_thinking`
    (Qwen3, GLM, DeepSeek's hybrids, ...) and gpt-oss's `reasoning_effort`. Both are
    passed; a template reads the one it has and ignores the other. None: no switch."""
    out: dict = {}
    if disabled is not None:
        out["enable_thinking"] = not disabled
    if effort is not None:
        if effort not in EFFORTS:
            raise ValueError(f"reasoning.effort: {effort!r} is not one of {', '.join(EFFORTS)}")
        out["enable_thinking"] = effort != "none"
        if effort != "none":
            out["reasoning_effort"] = "low" if effort == "minimal" else effort
    return out or None


def output_family(family: str, template_kwargs) -> str:
    """The output format a request's parser reads: without `-thinking` when the client
    switched reasoning off (the template's generation prompt then closes it)."""
    if template_kwargs and template_kwargs.get("enable_thinking") is False:
        return family.removesuffix("-thinking")
    return family
