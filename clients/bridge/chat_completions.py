"""OpenAI chat completions (`/v1/chat/completions`) and completions (`/v1/completions`).

Translates their bodies into the engine's Generate call (clients.client.AsyncClient)
and its events back into OpenAI's objects: a whole response, or server-sent
events when `stream` is set (chunks, the finish chunk, the usage chunk when
asked, `[DONE]`). The model's own markup is parsed out of its output by the
parser of its family (clients.bridge.parsers, `output_format` from ModelInfo):
reasoning becomes `reasoning_content`, and with `tools` (unless `tool_choice`
is "none") its tool calls become `tool_calls`, streamed as `delta.tool_calls`
(a first chunk with the call's index, id and name, then its arguments). A call
whose markup does not parse is returned as content, with a warning in the log.
The model name must be served (clients.bridge.models; replies carry the name
asked for).
An assistant message sent back with `reasoning_content` has it rendered by the
chat template again, so its tokens match what the cache holds.

A body becomes an `Asked` (clients.bridge.engine_call), which makes the engine
call as on every wire: the session key, the cache namespace and the output's
constraint are read there; the call goes to the backend for the request's
Caller (clients.bridge.guard), whose token and identity decide the tenant.
No `from __future__ import annotations`: FastAPI reads the annotations of the
routes defined inside `add_routes`.
"""

import json
import logging
import time
import uuid
from types import SimpleNamespace

from clients.bridge.engine_call import Asked, engine_call, hints_of, output_family
from clients.bridge.errors import lineage_error, unless_disconnected
from clients.bridge.guard import caller_of
from clients.bridge.parsers import (
    OutputParser,
    ReasoningPart,
    TextPart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    joined,
    make_parser,
)
from clients.client import Chunk, Final, LineageError, Progress, Usage
from clients.wire import InvalidInput

log = logging.getLogger("lineage.bridge")


def _usage(usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _entry(lp) -> dict:
    """One token's log-probability in chat-completions' shape (clients.wire.TokenLogprob)."""
    return {"token": lp.token, "logprob": lp.logprob, "bytes": list(lp.token.encode())}


def chat_logprobs(logprobs) -> dict:
    """A choice's `logprobs`: each token's, with its top alternatives."""
    content = [_entry(lp) | {"top_logprobs": [_entry(t) for t in lp.top]} for lp in logprobs]
    return {"content": content, "refusal": None}


def text_logprobs(logprobs, offset: int = 0) -> dict:
    """A text_completion choice's `logprobs` (the legacy shape), text offsets from `offset`."""
    offsets = []
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.token)
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{t.token: t.logprob for t in lp.top} for lp in logprobs],
        "text_offset": offsets,
    }


class _Shape:
    """The envelope shared by the chunks and the whole response of one request; with n > 1,
    one shape per branch (`branch`: each its own parser, offsets, logprobs), one envelope."""

    object_whole = object_chunk = ""
    logprobs = False  # the request asked for them
    index, n = 0, 1  # this branch; the request's branches

    def __init__(self, rid: str, info: dict):
        self.id, self.created = rid, int(time.time())
        self.model, self.fingerprint = info["id"], info["fingerprint"]
        self.make = None  # () -> a fresh shape for another branch
        self.branches: dict[int, "_Shape"] = {0: self}

    def branch(self, index: int) -> "_Shape":
        """Branch `index`'s shape (0: this one)."""
        if index not in self.branches:
            shape = self.make()
            shape.index, shape.logprobs, shape.created = index, self.logprobs, self.created
            self.branches[index] = shape
        return self.branches[index]

    def head(self) -> list[dict]:
        return [c for i in range(self.n) for c in self.branch(i).first()]

    def first(self) -> list[dict]:
        """The chunks that open this branch's stream."""
        return []

    def whole(self, result) -> dict:
        """The whole response: every branch's choice; the usage counts the prompt once."""
        results = result.choices or (result,)
        choices = [self.branch(i).choice(r) for i, r in enumerate(results)]
        return self.envelope(self.object_whole, choices, usage=_usage(result.usage))

    def envelope(self, kind: str, choices: list, **extra) -> dict:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
            **extra,
        }

    def usage_chunk(self, *finals: Final) -> dict:
        """The usage of every branch's final: the prompt once, each branch's completion."""
        u = finals[0].usage
        completion = sum(f.usage.completion_tokens for f in finals)
        usage = Usage(u.prompt_tokens, u.cached_tokens, completion)
        return self.envelope(self.object_chunk, [], usage=_usage(usage))


def malformed_call(rid: str, raw: str) -> None:
    """A tool call whose markup did not parse goes out as text: say so in the log."""
    log.warning("request %s: a tool call did not parse; returned as text: %.300r", rid, raw)


class ChatShape(_Shape):
    """chat.completion and chat.completion.chunk objects, the output parsed by `parser`."""

    object_whole, object_chunk = "chat.completion", "chat.completion.chunk"

    def __init__(self, rid: str, info: dict, parser: OutputParser):
        super().__init__(f"chatcmpl-{rid}", info)
        self.rid, self.parser, self.calls = rid, parser, 0
        self.started: set[int] = set()  # the calls whose start went out
        self.pending: list = []  # log-probabilities not sent yet

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
        logprobs = None
        if self.logprobs and self.pending:  # the tokens' since the last chunk
            logprobs, self.pending = chat_logprobs(self.pending), []
        return self.envelope(
            self.object_chunk,
            [
                {
                    "index": self.index,
                    "delta": delta,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason,
                }
            ],
        )

    def first(self) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def _deltas(self, parts) -> list[dict]:
        """Parts -> chunks: content, reasoning_content, tool_calls (OpenAI's streaming)."""
        out = []
        for p in parts:
            if isinstance(p, TextPart):
                out.append(self._chunk({"content": p.text}))
            elif isinstance(p, ReasoningPart):
                out.append(self._chunk({"reasoning_content": p.text}))
            elif isinstance(p, ToolCallStart):
                self.calls += 1
                self.started.add(p.index)
                fn = {"name": p.name, "arguments": ""}
                call = {"index": p.index, "id": p.call_id, "type": "function", "function": fn}
                out.append(self._chunk({"tool_calls": [call]}))
            elif isinstance(p, ToolCallDelta):
                call = {"index": p.index, "function": {"arguments": p.arguments_text}}
                out.append(self._chunk({"tool_calls": [call]}))
            elif isinstance(p, ToolCallEnd) and p.index not in self.started:
                malformed_call(self.rid, p.raw)
                if p.raw:  # "": a call the output's end cut, dropped
                    out.append(self._chunk({"content": p.raw}))
        return out

    def delta(self, text: str, logprobs=()) -> list[dict]:
        self.pending += logprobs
        return self._deltas(self.parser.feed(text))

    def finish(self, final: Final) -> list[dict]:
        out = self._deltas(self.parser.close())
        out.append(self._chunk({}, finish_reason(final.finish_reason, self.calls)))
        return out

    def choice(self, result) -> dict:
        """This branch's whole choice."""
        parts = self.parser.feed(result.text) + self.parser.close()
        content, reasoning, calls = joined(parts)
        started = {p.index for p in parts if isinstance(p, ToolCallStart)}
        for p in parts:
            if isinstance(p, ToolCallEnd) and p.index not in started:
                malformed_call(self.rid, p.raw)
        message = {"role": "assistant", "content": content or (None if calls else "")}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [
                {
                    "id": start.call_id,
                    "type": "function",
                    "function": {"name": start.name, "arguments": _arguments_text(parts, start)},
                }
                for start, _ in calls
            ]
        return {
            "index": self.index,
            "message": message,
            "logprobs": chat_logprobs(result.logprobs) if self.logprobs else None,
            "finish_reason": finish_reason(result.finish_reason, len(calls)),
        }


def finish_reason(reason: str, calls: int) -> str:
    """`tool_calls` when the reply has calls, unless the length cut it (a call streamed
    before the cut is in it, but the reply is not finished)."""
    return "tool_calls" if calls and reason != "length" else reason


def _arguments_text(parts, start: ToolCallStart) -> str:
    return "".join(
        p.arguments_text for p in parts if isinstance(p, ToolCallDelta) and p.index == start.index
    )


class TextShape(_Shape):
    """text_completion objects (`/v1/completions`)."""

    object_whole = object_chunk = "text_completion"

    def __init__(self, rid: str, info: dict):
        super().__init__(f"cmpl-{rid}", info)
        self.offset = 0  # text sent so far (the logprobs' text offsets)

    def _choice(self, text: str, finish_reason: str | None, logprobs=()) -> dict:
        shown = text_logprobs(logprobs, self.offset) if self.logprobs else None
        return {
            "index": self.index,
            "text": text,
            "logprobs": shown,
            "finish_reason": finish_reason,
        }

    def delta(self, text: str, logprobs=()) -> list[dict]:
        if not text and not logprobs:
            return []
        chunk = self.envelope(self.object_chunk, [self._choice(text, None, logprobs)])
        self.offset += len(text)
        return [chunk]

    def finish(self, final: Final) -> list[dict]:
        return [self.envelope(self.object_chunk, [self._choice("", final.finish_reason)])]

    def choice(self, result) -> dict:
        return self._choice(result.text, result.finish_reason, result.logprobs)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _events_as_sse(first, stream, shape: _Shape, include_usage: bool):
    """The SSE body: chunks, the finish chunk, the usage chunk, `[DONE]`.

    Progress becomes an SSE comment (clients ignore it; it keeps proxies from
    timing out a long prefill). Closing this generator early, as Starlette does
    when the client disconnects, cancels the gRPC call.
    """
    try:
        for chunk in shape.head():
            yield _sse(chunk)
        event, finals = first, []
        while event is not None:
            if isinstance(event, Progress):
                yield f": prefill {event.done}/{event.total}\n\n"
            elif isinstance(event, Chunk):
                for chunk in shape.branch(event.index).delta(event.text, event.logprobs):
                    yield _sse(chunk)
            elif isinstance(event, Final) and event.finish_reason != "error":  # else: error next
                for chunk in shape.branch(event.index).finish(event):
                    yield _sse(chunk)
                finals.append(event)
                if include_usage and len(finals) == shape.n:  # the last branch's
                    yield _sse(shape.usage_chunk(*finals))
            event = await anext(stream, None)
    except LineageError as error:
        yield _sse(lineage_error(error)[1])
    finally:
        stream.cancel()
    yield "data: [DONE]\n\n"


def _asked(body, **prompt) -> Asked:
    """The OpenAI sampling fields and cache hints, with the prompt -> Asked."""
    max_tokens = getattr(body, "max_completion_tokens", None)
    max_tokens = max_tokens if max_tokens is not None else body.max_tokens
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    return Asked(
        **prompt,
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop=stop,
        n=body.n,
        **_logprobs_asked(body),
        **hints_of(body),
    )


def _logprobs_asked(body) -> dict:
    """`logprobs` / `top_logprobs` (chat) or `logprobs: k` (completions) -> the engine's."""
    logprobs, top = body.logprobs, getattr(body, "top_logprobs", None)
    if isinstance(logprobs, bool) or logprobs is None:  # chat-completions
        if top is not None and not logprobs:
            raise InvalidInput("top_logprobs: needs logprobs true")
        return {"logprobs": bool(logprobs), "top_logprobs": top or 0}
    if logprobs < 0:
        raise InvalidInput(f"logprobs: must be >= 0, got {logprobs}")
    return {"logprobs": True, "top_logprobs": logprobs}


async def _respond(request, body, stream, shape: _Shape):
    """A whole JSON response, or SSE once the first event shows the request was accepted."""
    from fastapi.responses import StreamingResponse
    from starlette.background import BackgroundTask

    if not body.stream:
        return shape.whole(await unless_disconnected(request, stream.result()))
    # Waiting for the first event turns an INVALID_ARGUMENT into a 400, not an SSE error.
    first = await unless_disconnected(request, anext(stream, None))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = _events_as_sse(first, stream, shape, include_usage)
    # On a disconnect Starlette cancels the sending task and then runs the
    # background task: closing the generator there cancels the gRPC call even when
    # the cancel landed outside the generator (in send).
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(events.aclose),
    )


def _schemas() -> SimpleNamespace:
    """The request bodies (pydantic). Unknown fields are accepted and ignored."""
    from pydantic import BaseModel, ConfigDict

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")

    class Function(Open):
        name: str
        arguments: str | dict = "{}"

    class ToolCall(Open):
        id: str | None = None
        type: str = "function"
        function: Function

    class Message(Open):
        role: str
        content: str | list[dict] | None = None
        tool_calls: list[ToolCall] | None = None
        tool_call_id: str | None = None
        name: str | None = None

    class StreamOptions(Open):
        include_usage: bool = False

    class Sampling(Open):
        model: str | None = None
        temperature: float | None = None
        top_p: float | None = None
        top_k: int | None = None
        max_tokens: int | None = None
        stop: str | list[str] | None = None
        seed: int | None = None
        n: int | None = None
        logprobs: bool | int | None = None  # chat: a bool; completions: how many top tokens
        stream: bool = False
        stream_options: StreamOptions | None = None
        user: str | None = None
        prompt_cache_key: str | None = None

    class Chat(Sampling):
        messages: list[Message]
        tools: list[dict] | None = None
        tool_choice: str | dict | None = None
        parallel_tool_calls: bool | None = None
        response_format: dict | None = None
        chat_template_kwargs: dict | None = None  # vLLM's and SGLang's: to the template
        max_completion_tokens: int | None = None
        top_logprobs: int | None = None

    class Completion(Sampling):
        prompt: str | list[int] | list[str]

    return SimpleNamespace(Chat=Chat, Completion=Completion)


def add_routes(app, backend) -> None:
    """Add `/v1/chat/completions` and `/v1/completions`, clients of `backend`."""
    from fastapi import Request

    s = _schemas()

    @app.post("/v1/chat/completions")
    async def chat_completions(body: s.Chat, request: Request):
        caller = caller_of(request)
        info, rid = await backend.model_info(caller), uuid.uuid4().hex
        name, info = request.app.state.served.route(body.model, info)
        info = dict(info, id=name)
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        for m in messages:  # OpenAI's newer name for the system role
            m["role"] = "system" if m["role"] == "developer" else m["role"]
        asked = _asked(
            body,
            messages=messages,
            tools=body.tools,
            # The output held to the response format or the tool choice (the engine checks it).
            response_format=body.response_format,
            tool_choice=body.tool_choice,
            parallel_tool_calls=body.parallel_tool_calls,
            template_kwargs=body.chat_template_kwargs,
        )
        kwargs = engine_call(request.headers, asked, info, rid)
        stream = backend.stream(caller, **kwargs)
        family = output_family(info.get("output_format") or "plain", body.chat_template_kwargs)
        calls = bool(body.tools) and body.tool_choice != "none"

        def parser() -> OutputParser:
            return make_parser(family, tool_calls=calls, tools=body.tools)

        shape = ChatShape(rid, info, parser())
        shape.logprobs, shape.n = bool(body.logprobs), kwargs["n"]
        shape.make = lambda: ChatShape(rid, info, parser())
        return await _respond(request, body, stream, shape)

    @app.post("/v1/completions")
    async def completions(body: s.Completion, request: Request):
        caller = caller_of(request)
        info, rid = await backend.model_info(caller), uuid.uuid4().hex
        name, info = request.app.state.served.route(body.model, info)
        info = dict(info, id=name)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            asked = _asked(body, prompt_ids=prompt)
        else:
            if isinstance(prompt, list):
                if len(prompt) != 1:
                    raise InvalidInput(f"prompt: one prompt per request, got {len(prompt)}")
                prompt = prompt[0]
            asked = _asked(body, prompt=prompt)
        kwargs = engine_call(request.headers, asked, info, rid)
        stream = backend.stream(caller, **kwargs)
        shape = TextShape(rid, info)
        shape.logprobs, shape.n = body.logprobs is not None, kwargs["n"]
        shape.make = lambda: TextShape(rid, info)
        return await _respond(request, body, stream, shape)
