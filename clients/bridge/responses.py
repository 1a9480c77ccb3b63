"""OpenAI Responses (`/v1/responses`): the wire of Codex CLI and the agents SDKs.

`POST /v1/responses` runs a request whose input (clients.bridge.responses_input)
the engine renders, and answers a Response object whose output items come from
the completion's blocks (clients.bridge.blocks): `reasoning`, `message` with
`output_text`, `function_call` (with its `namespace` where the tool sat in one;
the tools offered: clients.bridge.responses_tools, hosted ones named in
`X-Lineage-Tools-Left-Out`). Streaming sends the documented events, each
with its `sequence_number`: `response.created`, `response.in_progress`; per item
`response.output_item.added`, its content part's `.added`, the text's
(`response.output_text.delta` / `.done`), reasoning's
(`response.reasoning_text.delta` / `.done`) or arguments'
(`response.function_call_arguments.delta` / `.done`), the part's `.done`,
`response.output_item.done`; then `response.completed` (`response.incomplete`
at max_output_tokens) with usage: `input_tokens_details.cached_tokens` and
`output_tokens_details.reasoning_tokens`. A failure once the stream has started
is `response.failed`.

With `store` (the default) the response and its conversation are kept
(clients.bridge.response_store), for `GET` and `DELETE /v1/responses/{id}` and
for a follow-up that names it as `previous_response_id` and sends only its new
items: the stored conversation is the start of the new prompt, the reply as the
model wrote it, so the engine's lineage cache restores past it and prefills
only the new items. No `from __future__ import annotations`: FastAPI reads the
routes' annotations.
"""

import json
import logging
import time
import uuid
from types import SimpleNamespace

from clients.bridge.blocks import (
    REASONING,
    TEXT,
    TOOL_CALL,
    Blocks,
    Closed,
    Grew,
    Opened,
)
from clients.bridge.engine_call import (
    Asked,
    drain,
    engine_call,
    hints_of,
    output_family,
    thinking_switches,
)
from clients.bridge.errors import WireError, unless_disconnected
from clients.bridge.guard import caller_of
from clients.bridge.parsers import make_parser
from clients.bridge.response_store import ID, Record, StoredNotFound, tenant_key
from clients.bridge.responses_input import (
    call_ids,
    join_turns,
    messages_of,
    tool_choice_parses,
)
from clients.bridge.responses_tools import Offered, check_choice, tools_of
from clients.client import Chunk, Final, LineageError, Progress
from clients.wire import InvalidInput, message_to_proto

log = logging.getLogger("lineage.bridge")

# Request fields the engine cannot honour: refused, never ignored.
UNSUPPORTED = {
    "background": "background responses are not served; stream instead",
    "conversation": "conversations are not stored here; use previous_response_id",
    "prompt": "stored prompt templates are not served",
}


def usage_of(final: Final, blocks: Blocks, cache_on: bool) -> dict:
    u = final.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": u.cached_tokens,
            "cache_write_tokens": max(u.prompt_tokens - u.cached_tokens, 0) if cache_on else 0,
        },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": blocks.reasoning_tokens},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


def _part(block) -> dict | None:
    """The content part a text or reasoning item opens with; None for a function call."""
    if block.kind == TEXT:
        return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    if block.kind == REASONING:
        return {"type": "reasoning_text", "text": ""}
    return None


class ResponseShape:
    """One response's object, output items and numbered stream events."""

    def __init__(
        self, rid: str, model: str, body, blocks: Blocks, cache_on: bool, offered=Offered()
    ):
        self.id, self.model, self.body, self.blocks = f"resp_{rid}", model, body, blocks
        self.cache_on, self.created_at, self.seq = cache_on, int(time.time()), 0
        self.offered = offered  # a namespaced tool's call goes out under its own name

    def item_id(self, block) -> str:
        prefix = {TEXT: "msg", REASONING: "rs"}.get(block.kind, "fc")
        return f"{prefix}_{self.id[5:]}{block.index:04d}"

    def item(self, block, status: str = "completed") -> dict:
        done = status == "completed"
        if block.kind == TEXT:
            part = {"type": "output_text", "text": block.text, "annotations": [], "logprobs": []}
            return {
                "type": "message",
                "id": self.item_id(block),
                "status": status,
                "role": "assistant",
                "content": [part] if done else [],
            }
        if block.kind == REASONING:
            text = [{"type": "reasoning_text", "text": block.text}] if done else []
            return {
                "type": "reasoning",
                "id": self.item_id(block),
                "summary": [],
                "content": text,
                "status": status,
            }
        name, namespace = self.offered.call_name(block.name)
        item = {
            "type": "function_call",
            "id": self.item_id(block),
            "call_id": block.call_id,
            "name": name,
            "arguments": block.text if done else "",
            "status": status,
        }
        return item | ({"namespace": namespace} if namespace else {})

    def response(self, status: str, final: Final | None = None, error: dict | None = None):
        b = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": [self.item(x) for x in self.blocks.blocks] if final else [],
            "usage": usage_of(final, self.blocks, self.cache_on) if final else None,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "metadata": b.metadata or {},
            "parallel_tool_calls": b.parallel_tool_calls,
            "previous_response_id": b.previous_response_id,
            "reasoning": b.reasoning,
            "store": b.store,
            "temperature": b.temperature,
            "text": b.text or {"format": {"type": "text"}},
            "tool_choice": b.tool_choice or "auto",
            "tools": b.tools or [],
            "top_p": b.top_p,
            "truncation": "disabled",
            "user": b.user,
        }

    def status(self, final: Final) -> str:
        return "incomplete" if final.finish_reason == "length" else "completed"

    def event(self, kind: str, **fields) -> tuple[str, dict]:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return kind, data

    def start(self) -> list[tuple[str, dict]]:
        return [
            self.event("response.created", response=self.response("in_progress")),
            self.event("response.in_progress", response=self.response("in_progress")),
        ]

    def events(self, block_events) -> list[tuple[str, dict]]:
        """The stream events of the completion's block events, numbered."""
        out = []
        for e in block_events:
            if isinstance(e, Opened):
                out += self._opened(e.block)
            elif isinstance(e, Grew):
                out += self._grew(e.block, e.delta)
            elif isinstance(e, Closed):
                out += self._closed(e.block)
        return out

    def _on(self, kind: str, block, in_part: bool = False, **fields) -> tuple[str, dict]:
        """An event about `block`'s item (and its one content part: `in_part`)."""
        where = {"output_index": block.index}
        if kind not in ("response.output_item.added", "response.output_item.done"):
            where["item_id"] = self.item_id(block)
        if in_part:
            where["content_index"] = 0
        return self.event(kind, **where, **fields)

    def _opened(self, block) -> list[tuple[str, dict]]:
        out = [self._on("response.output_item.added", block, item=self.item(block, "in_progress"))]
        part = _part(block)
        if part is not None:
            out.append(self._on("response.content_part.added", block, True, part=part))
        return out

    def _grew(self, block, delta: str) -> list[tuple[str, dict]]:
        if block.kind == TEXT:
            return [self._on("response.output_text.delta", block, True, delta=delta, logprobs=[])]
        if block.kind == REASONING:
            return [self._on("response.reasoning_text.delta", block, True, delta=delta)]
        return [self._on("response.function_call_arguments.delta", block, delta=delta)]

    def _closed(self, block) -> list[tuple[str, dict]]:
        if block.kind == TOOL_CALL:
            arguments = {"name": self.offered.call_name(block.name)[0], "arguments": block.text}
            out = [self._on("response.function_call_arguments.done", block, **arguments)]
        else:
            text = {"text": block.text} | ({"logprobs": []} if block.kind == TEXT else {})
            kind = "output_text" if block.kind == TEXT else "reasoning_text"
            part = dict(_part(block), text=block.text)
            out = [
                self._on(f"response.{kind}.done", block, True, **text),
                self._on("response.content_part.done", block, True, part=part),
            ]
        return out + [self._on("response.output_item.done", block, item=self.item(block))]

    def finish(self, final: Final) -> list[tuple[str, dict]]:
        status = self.status(final)
        return [self.event(f"response.{status}", response=self.response(status, final))]

    def failed(self, message: str, engine_code: str = "") -> list[tuple[str, dict]]:
        """`response.failed`, its error code one of the documented (by the engine's status)."""
        code = "rate_limit_exceeded" if engine_code == "RESOURCE_EXHAUSTED" else "server_error"
        error = {"code": code, "message": message}
        return [self.event("response.failed", response=self.response("failed", error=error))]


def _sse(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class Turn:
    """One request's run: its shape, what it sends the engine, and what it stores."""

    def __init__(self, shape: ResponseShape, store, caller, conversation: list[dict]):
        self.shape, self.store, self.caller = shape, store, caller
        self.conversation, self.reply = conversation, ""

    def feed(self, text: str, ids: int) -> list[tuple[str, dict]]:
        self.reply += text
        return self.shape.events(self.shape.blocks.feed(text, ids))

    def finish(self, final: Final) -> list[tuple[str, dict]]:
        """The last blocks and the final event; the response stored first when asked."""
        events = self.shape.events(self.shape.blocks.close())
        status = self.shape.status(final)
        if self.shape.body.store:
            reply = {"role": "assistant", "content": self.reply}  # as the model wrote it
            calls = tuple(b.call_id for b in self.shape.blocks.tool_calls)
            response = self.shape.response(status, final)
            record = Record(
                self.shape.id,
                tenant_key(self.caller.tenant),
                response,
                tuple(self.conversation) + (reply,),
                calls,
            )
            self.store.put(record)
        return events + self.shape.finish(final)


async def _events_as_sse(first, stream, turn: Turn):
    """The SSE body. Closing it early, as Starlette does on a disconnect, cancels the call."""
    try:
        for kind, data in turn.shape.start():
            yield _sse(kind, data)
        event = first
        while event is not None:
            if isinstance(event, Progress):
                yield f": prefill {event.done}/{event.total}\n\n"
            elif isinstance(event, Chunk):
                for kind, data in turn.feed(event.text, len(event.ids)):
                    yield _sse(kind, data)
            elif isinstance(event, Final) and event.finish_reason != "error":  # else: error next
                for kind, data in turn.finish(event):
                    yield _sse(kind, data)
            event = await anext(stream, None)
    except LineageError as error:
        for kind, data in turn.shape.failed(error.message, error.code):
            yield _sse(kind, data)
    finally:
        stream.cancel()


def _schemas() -> SimpleNamespace:
    """The request body (pydantic). Unknown fields are accepted and ignored."""
    from pydantic import BaseModel, ConfigDict

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")

    class Create(Open):
        model: str | None = None
        input: str | list = ""  # checked item by item (responses_input), naming the field
        instructions: str | None = None
        previous_response_id: str | None = None
        tools: list | None = None
        tool_choice: str | dict | None = None
        parallel_tool_calls: bool = True
        max_output_tokens: int | None = None
        temperature: float | None = None
        top_p: float | None = None
        store: bool = True
        stream: bool = False
        reasoning: dict | None = None
        text: dict | None = None
        metadata: dict | None = None
        user: str | None = None
        prompt_cache_key: str | None = None

    return SimpleNamespace(Create=Create)


def _check(body) -> None:
    for field, why in UNSUPPORTED.items():
        if getattr(body, field, None):
            raise InvalidInput(f"{field}: {why}")
    kind = ((body.text or {}).get("format") or {}).get("type", "text")
    if kind not in ("text", "json_schema", "json_object"):
        raise InvalidInput(f"text.format.type: {kind!r} is not text, json_schema or json_object")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise InvalidInput(f"max_output_tokens: must be at least 1, got {body.max_output_tokens}")


def add_routes(app, backend, served, store) -> None:
    """Add `/v1/responses` (POST) and `/v1/responses/{id}` (GET, DELETE), clients of
    `backend`; `served` says which model names are served, `store` keeps responses."""
    import asyncio

    from fastapi import Request
    from fastapi.responses import StreamingResponse
    from starlette.background import BackgroundTask

    s = _schemas()

    async def stored(tenant: str, response_id: str, field: str | None = None) -> Record:
        """The tenant's record: from memory at once, else read off the event loop."""
        held = store.held(tenant, response_id)
        if held is not None:
            return held
        try:
            if not ID.fullmatch(response_id or ""):
                raise StoredNotFound(response_id)
            return await asyncio.to_thread(store.get, tenant, response_id)
        except StoredNotFound as error:
            code = f"{field}_not_found" if field else "not_found"
            raise WireError(404, str(error), field, code) from None

    @app.post("/v1/responses")
    async def create(body: s.Create, request: Request):
        _check(body)
        caller = caller_of(request)
        info = await backend.model_info(caller)
        model, info = served.route(body.model, info)
        # 1) the prompt: the instructions, the stored conversation, the new items
        started = time.perf_counter()
        history, known = (), set()
        if body.previous_response_id:
            record = await stored(caller.tenant, body.previous_response_id, "previous_response_id")
            history, known = record.conversation, set(record.calls)
        new = messages_of(body.input, known | call_ids(history))
        conversation = join_turns(list(history), new)
        # Every message converted each turn, as on the other wires: the store holds bytes.
        prepared = [message_to_proto(m) for m in conversation]
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        rid = uuid.uuid4().hex
        offered = tools_of(body.tools)
        tools, choice = list(offered.functions), check_choice(body.tool_choice, offered)
        if offered.left_out:
            log.info("request %s: hosted tools left out: %s", rid, ", ".join(offered.left_out))
        # 2) the engine call
        effort = (body.reasoning or {}).get("effort")
        try:  # the template's reasoning switch, where it has one
            switches = thinking_switches(effort=effort) if effort is not None else None
        except ValueError as e:
            raise InvalidInput(str(e)) from None
        asked = Asked(
            messages=system + prepared,
            tools=tools or None,
            max_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            # The output held to text.format or the tool choice (the engine checks the schema).
            response_format=(body.text or {}).get("format"),
            tool_choice=choice,
            parallel_tool_calls=body.parallel_tool_calls,
            where="text.format",
            template_kwargs=switches,
            **hints_of(body),
        )
        stream = backend.stream(caller, **engine_call(request.headers, asked, info, rid))
        build_ms = f"{(time.perf_counter() - started) * 1000:.3f}"
        # 3) the answer, whole or streamed
        parsing = bool(tools) and tool_choice_parses(choice)
        family = output_family(info["output_format"], switches)
        parser = make_parser(family, tool_calls=parsing, tools=tools or None)
        cache_on = info["reply"].get("cache_mode", "lineage") != "off"
        shape = ResponseShape(rid, model, body, Blocks(parser), cache_on, offered)
        turn = Turn(shape, store, caller, conversation)
        headers = {"X-Lineage-Prompt-Build-Ms": build_ms}
        if offered.left_out:  # hosted tools: not in the prompt, named for the client
            headers["X-Lineage-Tools-Left-Out"] = ", ".join(offered.left_out)
        if not body.stream:
            final = await unless_disconnected(request, drain(stream, turn.feed))
            turn.finish(final)
            from fastapi.responses import JSONResponse

            return JSONResponse(shape.response(shape.status(final), final), headers=headers)
        # Waiting for the first event turns an INVALID_ARGUMENT into a 400, not an SSE error.
        first = await unless_disconnected(request, anext(stream, None))
        events = _events_as_sse(first, stream, turn)
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
            background=BackgroundTask(events.aclose),
        )

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request):
        return (await stored(caller_of(request).tenant, response_id)).response

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request):
        tenant = caller_of(request).tenant
        await stored(tenant, response_id)
        await asyncio.to_thread(store.delete, tenant, response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}
