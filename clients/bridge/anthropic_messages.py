"""Anthropic Messages (`/v1/messages`, `/v1/messages/count_tokens`): Claude Code's wire.

A request becomes the engine's chat messages (clients.bridge.anthropic_request)
and its completion Anthropic's content blocks (clients.bridge.blocks): `text`,
`thinking`, `tool_use` with parsed `input`; `stop_reason` end_turn, max_tokens
or tool_use. Streaming sends Anthropic's events in its documented order:
`message_start`; per block `content_block_start`, its `content_block_delta`s
(`text_delta`, `thinking_delta`, `input_json_delta`), `content_block_stop`;
`message_delta` with the stop reason and the usage; `message_stop`. A long
prefill's progress becomes `ping` events, and a failure once the stream has
started an `error` event. Usage has Anthropic's meanings, which add up to the
prompt: `cache_read_input_tokens` restored from the cache,
`cache_creation_input_tokens` prefilled and stored by it (every prefilled token,
unless the cache is off), `input_tokens` prefilled and not stored. Errors are
Anthropic-shaped (clients.bridge.errors). `x-api-key` or `Authorization: Bearer`
carries the token; `anthropic-version` and `anthropic-beta` are accepted. No
`from __future__ import annotations`: FastAPI reads the routes' annotations.
"""

import json
import uuid
from types import SimpleNamespace

from clients.bridge.anthropic_request import Prompt, prompt_of
from clients.bridge.blocks import REASONING, TEXT, Blocks, Closed, Grew, Opened
from clients.bridge.engine_call import (
    Asked,
    drain,
    engine_call,
    hints_of,
    output_family,
    thinking_switches,
)
from clients.bridge.errors import (
    engine_status,
    error_json,
    unless_disconnected,
)
from clients.bridge.guard import caller_of
from clients.bridge.parsers import make_parser
from clients.client import Chunk, Final, LineageError, Progress
from clients.wire import InvalidInput

STOP_REASONS = {"length": "max_tokens"}  # "stop": end_turn, or tool_use with tool calls


def usage_of(final: Final | None, cache_on: bool, blocks: Blocks | None = None) -> dict:
    """Anthropic's usage of a finished request: its four counts add up as Anthropic's do."""
    if final is None:
        return {"input_tokens": 0, "output_tokens": 0}
    u = final.usage
    prefilled = max(u.prompt_tokens - u.cached_tokens, 0)
    usage = {
        "input_tokens": 0 if cache_on else prefilled,
        "cache_creation_input_tokens": prefilled if cache_on else 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    }
    if blocks is not None:
        usage["output_tokens_details"] = {"thinking_tokens": blocks.reasoning_tokens}
    return usage


def stop_reason(final: Final, blocks: Blocks) -> str:
    if blocks.tool_calls and final.finish_reason == "stop":
        return "tool_use"
    if final.stop_sequence:
        return "stop_sequence"
    return STOP_REASONS.get(final.finish_reason, "end_turn")


def stop_sequence(final: Final | None) -> str | None:
    """The stop sequence that ended the reply, as Anthropic reports it (None: none did)."""
    return (final.stop_sequence or None) if final is not None else None


def content_block(block, opening: bool = False) -> dict:
    """A block as Anthropic content: finished, or as its content_block_start shows it."""
    if block.kind == TEXT:
        return {"type": "text", "text": "" if opening else block.text}
    if block.kind == REASONING:
        return {"type": "thinking", "thinking": "" if opening else block.text, "signature": ""}
    arguments = {} if opening else block.arguments
    return {"type": "tool_use", "id": block.call_id, "name": block.name, "input": arguments}


class MessageShape:
    """One response's message object and stream events."""

    def __init__(self, rid: str, model: str, cache_on: bool, blocks: Blocks):
        self.id, self.model, self.cache_on, self.blocks = f"msg_{rid}", model, cache_on, blocks

    def message(self, final: Final | None, content: list) -> dict:
        done = final is not None
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason(final, self.blocks) if done else None,
            "stop_sequence": stop_sequence(final),
            "usage": usage_of(final, self.cache_on, self.blocks if done else None),
        }

    def whole(self, final: Final) -> dict:
        """The message, once `blocks` were fed the whole completion."""
        self.blocks.close()
        return self.message(final, [content_block(b) for b in self.blocks.blocks])

    def start(self) -> list[tuple[str, dict]]:
        return [("message_start", {"type": "message_start", "message": self.message(None, [])})]

    def events(self, block_events) -> list[tuple[str, dict]]:
        out = []
        for e in block_events:
            index = e.block.index
            if isinstance(e, Opened):
                start = content_block(e.block, opening=True)
                body = {"type": "content_block_start", "index": index, "content_block": start}
                out.append(("content_block_start", body))
            elif isinstance(e, Grew):
                delta = {
                    TEXT: {"type": "text_delta", "text": e.delta},
                    REASONING: {"type": "thinking_delta", "thinking": e.delta},
                }.get(e.block.kind, {"type": "input_json_delta", "partial_json": e.delta})
                body = {"type": "content_block_delta", "index": index, "delta": delta}
                out.append(("content_block_delta", body))
            elif isinstance(e, Closed):
                body = {"type": "content_block_stop", "index": index}
                out.append(("content_block_stop", body))
        return out

    def finish(self, final: Final) -> list[tuple[str, dict]]:
        delta = {
            "stop_reason": stop_reason(final, self.blocks),
            "stop_sequence": stop_sequence(final),
        }
        usage = usage_of(final, self.cache_on, self.blocks)
        return [
            ("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}),
            ("message_stop", {"type": "message_stop"}),
        ]


def _sse(event: str, data: dict) -> str:
    return (
        f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"
    )


PING = _sse("ping", {"type": "ping"})


async def _events_as_sse(first, stream, shape: MessageShape):
    """The SSE body. Closing it early, as Starlette does on a disconnect, cancels the call."""
    try:
        for name, data in shape.start():
            yield _sse(name, data)
        event = first
        while event is not None:
            if isinstance(event, Progress):
                yield PING
            elif isinstance(event, Chunk):
                for name, data in shape.events(shape.blocks.feed(event.text, len(event.ids))):
                    yield _sse(name, data)
            elif isinstance(event, Final) and event.finish_reason != "error":  # else: error next
                for name, data in shape.events(shape.blocks.close()):
                    yield _sse(name, data)
                for name, data in shape.finish(event):
                    yield _sse(name, data)
            event = await anext(stream, None)
    except LineageError as error:
        status = engine_status(error.code, "anthropic")
        yield _sse("error", error_json("anthropic", status, error.message))
    finally:
        stream.cancel()


def _schemas() -> SimpleNamespace:
    """The request bodies (pydantic). Unknown fields are accepted and ignored."""
    from pydantic import BaseModel, ConfigDict

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")

    class Count(Open):
        model: str | None = None
        messages: list  # checked block by block (anthropic_request), naming the field
        system: str | list | None = None
        tools: list | None = None
        tool_choice: dict | None = None

    class Messages(Count):
        max_tokens: int
        stop_sequences: list[str] | None = None
        temperature: float | None = None
        top_p: float | None = None
        top_k: int | None = None
        stream: bool = False
        metadata: dict | None = None

    return SimpleNamespace(Messages=Messages, Count=Count)


def add_routes(app, backend, served) -> None:
    """Add `/v1/messages` and `/v1/messages/count_tokens`, clients of `backend`.

    `served` (clients.bridge.models.ServedModels) says which model names are served.
    """
    from fastapi import Request
    from fastapi.responses import StreamingResponse
    from starlette.background import BackgroundTask

    s = _schemas()

    def switches_of(body) -> dict | None:
        """`thinking: {type: disabled|enabled}` as the template's reasoning switch."""
        thinking = (body.model_extra or {}).get("thinking")
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("disabled", "enabled"):
            return None
        return thinking_switches(disabled=kind == "disabled")

    async def begin(body, request: Request, held: bool = False, **sampling):
        """(model name, info, prompt, rid, stream) of a request the engine runs; `held`:
        its output is held to its tool_choice (any, tool, none; auto with tools is lazy)."""
        caller = caller_of(request)
        info = await backend.model_info(caller)
        model, info = served.route(body.model, info)
        prompt: Prompt = prompt_of(body)
        rid = uuid.uuid4().hex
        asked = Asked(
            messages=list(prompt.messages),
            tools=list(prompt.tools) or None,
            continue_final=prompt.continue_final,
            tool_choice=body.tool_choice if held else None,
            template_kwargs=switches_of(body),
            cache_marks=prompt.marks,
            **hints_of(body),
            **sampling,
        )
        stream = backend.stream(caller, **engine_call(request.headers, asked, info, rid))
        return model, info, prompt, rid, stream

    @app.post("/v1/messages")
    async def messages(body: s.Messages, request: Request):
        if body.max_tokens < 1:
            raise InvalidInput(f"max_tokens: must be at least 1, got {body.max_tokens}")
        model, info, prompt, rid, stream = await begin(
            body,
            request,
            held=True,
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            stop=body.stop_sequences,
        )
        tools = list(prompt.tools) or None
        family = output_family(info["output_format"], switches_of(body))
        parser = make_parser(family, tool_calls=prompt.parse_tools, tools=tools)
        cache_on = info["reply"].get("cache_mode", "lineage") != "off"
        shape = MessageShape(rid, model, cache_on, Blocks(parser))
        if not body.stream:
            final = await unless_disconnected(request, drain(stream, shape.blocks.feed))
            return shape.whole(final)
        # Waiting for the first event turns an INVALID_ARGUMENT into a 400, not an SSE error.
        first = await unless_disconnected(request, anext(stream, None))
        events = _events_as_sse(first, stream, shape)
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=BackgroundTask(events.aclose),
        )

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: s.Count, request: Request):
        # The engine tokenizes inside Generate: one token's run counts the prompt (and
        # leaves it in the cache for the request that usually follows).
        *_, stream = await begin(body, request, max_tokens=1, temperature=0.0)
        result = await unless_disconnected(request, stream.result())
        return {"input_tokens": result.usage.prompt_tokens}
