"""The one road from every wire format into the engine: a parsed request -> the engine call.

Each wire (chat completions, Anthropic Messages, Responses) reads its own body
into an `Asked`: the prompt (messages and tools, or a completion's text or ids),
the sampling, what holds the output (its response format and tool choice, by
the wire's own field names), the template's switches and the cache hints it
carries. `engine_call` turns an `Asked` and the HTTP request's headers into the
keyword arguments of the backend's `stream` (besides the Caller): so a hint
read here reaches the engine the same way from all three. It reads, the same on
every wire:

- the session key (which replica keeps the conversation), the first given of
  `prompt_cache_key`, the `x-session-id`, `session_id` and `x-session-affinity`
  headers (agents' own: Codex, OpenCode, ...), Claude Code's
  `metadata.user_id`, then `user` (`session_of`); hashed when it is no
  identifier (clients.wire.session_key);
- the cache namespace: the `X-Cache-Namespace` header alone (`namespace_of`).
  `user` names the session, never the namespace: a namespace splits the cache,
  so an end user's id as one would store the shared system prompt and tools
  once per end user; the Caller's token places the namespace under its tenant.

`drain` runs a whole (not streamed) request chunk by chunk; `thinking_switches`
and `output_family` are the reasoning switches and the parser's family they
imply. It knows HTTP headers and the engine call; nothing of any wire's shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clients.constraints import constraint_for
from clients.wire import session_key

# The headers agents send to name their conversation, in the order they are read.
SESSION_HEADERS = ("x-session-id", "session_id", "x-session-affinity")


@dataclass(frozen=True)
class Asked:
    """What one request asks of the engine, read off its wire's body (None: not given).

    Exactly one of `messages`, `prompt`, `prompt_ids`. The output is held by
    `response_format` (named `where` in errors: chat's `response_format`,
    Responses' `text.format`) or `tool_choice` (either wire's shape).
    """

    messages: list[dict] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    tools: list[dict] | None = None
    continue_final: bool = False  # the last message is the assistant's, continued
    # sampling
    max_tokens: int | None = None  # None: the context (the engine clips it to the room left)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    n: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    # what holds the output
    response_format: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    where: str = "response_format"
    template_kwargs: dict | None = None  # the chat template's switches
    # cache hints
    cache_marks: tuple[int, ...] = ()  # messages the client marked (cache_control)
    prompt_cache_key: str | None = None
    user_id: str | None = None  # Claude Code's metadata.user_id
    user: str | None = None


def hints_of(body) -> dict:
    """The session hints of a wire's body (a pydantic model; fields it does not declare
    included), read the same off every wire: `prompt_cache_key`, `metadata.user_id`,
    `user`. Keyword arguments of Asked."""
    metadata = getattr(body, "metadata", None)
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    return {
        "prompt_cache_key": _text(getattr(body, "prompt_cache_key", None)),
        "user_id": _text(user_id),
        "user": _text(getattr(body, "user", None)),
    }


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def session_of(headers, asked: Asked) -> str:
    """The conversation's session key, the same on every wire (module doc); "" for none."""
    for value in (
        asked.prompt_cache_key,
        *(headers.get(h) for h in SESSION_HEADERS),
        asked.user_id,
        asked.user,
    ):
        if value:
            return session_key(value)
    return ""


def namespace_of(headers) -> str:
    """The cache namespace asked for: the `X-Cache-Namespace` header, else ""."""
    return headers.get("x-cache-namespace") or ""


def engine_call(headers, asked: Asked, info: dict, request_id: str) -> dict:
    """Keyword arguments of the backend's `stream` (besides the Caller) for `asked`, with
    the request's `headers`, to the model `info` describes (Backend.model_info)."""
    prompt = {
        "messages": asked.messages,
        "prompt": asked.prompt,
        "prompt_ids": asked.prompt_ids,
    }
    call = {k: v for k, v in prompt.items() if v is not None}
    if asked.messages is not None:
        call["tools"] = asked.tools or None
        call["continue_final_message"] = asked.continue_final
        call["cache_marks"] = asked.cache_marks
        call["template_kwargs"] = asked.template_kwargs
    max_tokens = info["max_context"] if asked.max_tokens is None else asked.max_tokens
    return call | {
        "model": info["engine_model"],
        "max_tokens": max_tokens,
        "temperature": 1.0 if asked.temperature is None else asked.temperature,  # the wires'
        "top_p": asked.top_p or 0.0,
        "top_k": asked.top_k or 0,
        "seed": asked.seed,
        "stop": asked.stop or None,
        "n": 1 if asked.n is None else asked.n,  # the engine refuses one past --max-n
        "logprobs": asked.logprobs,
        "top_logprobs": asked.top_logprobs,
        "constraint": constraint_for(
            asked.response_format,
            asked.tool_choice,
            asked.parallel_tool_calls,
            asked.tools,
            where=asked.where,
        ),
        "session": session_of(headers, asked),
        "namespace": namespace_of(headers),
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
