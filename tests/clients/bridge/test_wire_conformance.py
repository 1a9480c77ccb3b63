"""Event order and fields of the Anthropic and Responses streams, checked against the
documented sequences and parsed by the official SDKs' own types and accumulators,
for text, reasoning and tool-use outputs; the whole response equals the stream's.

The completions are scripted texts fed to the wire shapes as the engine's chunks
(the tiny random model writes neither reasoning nor tool calls); the served path
runs in test_bridge_anthropic.py and test_bridge_responses.py.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from clients.bridge import anthropic_messages, responses
from clients.bridge.anthropic_messages import MessageShape
from clients.bridge.blocks import Blocks
from clients.bridge.guard import Caller
from clients.bridge.parsers import make_parser
from clients.bridge.response_store import ResponseStore
from clients.bridge.responses import ResponseShape, Turn
from clients.client import Chunk, Final, LineageError, Progress, Restore, Timing, Usage
from tests.clients.bridge import test_call_formats, test_parsers

CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "setup.py"}}\n</tool_call>'
OUTPUTS = {
    "text": "Prompt caches keep the prefix.",
    "reasoning": "<think>\nThe user asks about caches.\n</think>\n\nThey keep the prefix.",
    "tool use": "<think>\nI should read it.\n</think>\n\nReading the file.\n" + CALL,
    "tool call alone": CALL,
}
USAGE = Usage(prompt_tokens=200, cached_tokens=128, completion_tokens=30)


def _pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _without_ids(message) -> list[dict]:
    """The content blocks, less the call ids each parse draws anew."""
    return [{k: v for k, v in b.items() if k != "id"} for b in message.model_dump()["content"]]


def _final(reason: str = "stop") -> Final:
    return Final(reason, USAGE, Restore("reply", 128), Timing(), "r")


# --------------------------------------------------------------- Anthropic ----

ANTHROPIC_ORDER = re.compile(
    r"message_start (ping )*"
    r"(content_block_start (content_block_delta )*content_block_stop )*"
    r"message_delta message_stop "
)
DELTA_OF = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}


def _anthropic_stream(text: str, reason: str = "stop", family="qwen") -> list[tuple[str, dict]]:
    shape = MessageShape("r1", "claude-test", True, Blocks(make_parser(family)))
    return _sse_events(anthropic_messages._events_as_sse, shape, text, reason)


class ScriptedStream:
    """The engine's events for one request, as the client library's AsyncStream yields them."""

    def __init__(self, events):
        self.events, self.cancelled = list(events), False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.events:
            raise StopAsyncIteration
        event = self.events.pop(0)
        if isinstance(event, Exception):
            raise event
        return event

    def cancel(self):
        self.cancelled = True


def _sse_events(events_as_sse, shape, text: str, reason: str = "stop", error=None):
    """The SSE body the route sends for `text` (as the engine's chunks), parsed back."""
    import asyncio

    events = [Progress(10, 400)] + [Chunk((1,), piece) for piece in _pieces(text)]
    events.append(error if error is not None else _final(reason))
    stream = ScriptedStream(events)

    async def body():
        first = await anext(stream)
        return [piece async for piece in events_as_sse(first, stream, shape)]

    out = []
    for piece in asyncio.run(body()):
        lines = dict(line.split(": ", 1) for line in piece.strip().splitlines() if ": " in line)
        if "data" in lines:
            out.append((lines.get("event", ""), json.loads(lines["data"])))
    assert stream.cancelled, "the stream was not closed"
    return out


@pytest.mark.parametrize("name", OUTPUTS)
def test_anthropic_events_follow_the_documented_sequence(name):
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import Message, RawMessageStreamEvent
    from pydantic import TypeAdapter

    events = _anthropic_stream(OUTPUTS[name])
    assert ANTHROPIC_ORDER.fullmatch("".join(kind + " " for kind, _ in events))
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, buffers, open_type = None, {}, None
    assert ("ping", {"type": "ping"}) in events, "the prefill's progress sent no ping"
    for index, (kind, data) in enumerate(events):
        assert data["type"] == kind
        if kind == "ping":  # the SDK skips pings: not one of its message events
            continue
        event = adapter.validate_python(data)  # every field the SDK requires
        if kind == "content_block_start":
            assert data["index"] == sum(k == "content_block_start" for k, _ in events[:index])
            open_type = data["content_block"]["type"]
        elif kind == "content_block_delta":
            assert data["delta"]["type"] == DELTA_OF[open_type]
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    streamed = Message.model_validate(snapshot.model_dump())
    whole_shape = MessageShape("r1", "claude-test", True, Blocks(make_parser("qwen")))
    for piece in _pieces(OUTPUTS[name], 5):
        whole_shape.blocks.feed(piece, 1)
    whole = whole_shape.whole(_final())
    assert _without_ids(streamed) == _without_ids(Message.model_validate(whole))
    assert streamed.stop_reason == ("tool_use" if "tool" in name else "end_turn")
    usage = streamed.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (0, 128)
    assert usage.cache_creation_input_tokens == 72 and usage.output_tokens == 30
    text = "".join(b.text for b in streamed.content if b.type == "text")
    assert "<" not in text, "markup leaked into text"
    if "tool" in name:
        assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
            ("read_file", {"path": "setup.py"})
        ]
    if name in ("reasoning", "tool use"):
        assert streamed.content[0].type == "thinking" and streamed.usage.output_tokens_details
        assert streamed.usage.output_tokens_details.thinking_tokens > 0


def test_anthropic_stop_reasons_and_usage_without_a_cache():
    shape = MessageShape("r", "m", False, Blocks(make_parser("qwen")))
    shape.blocks.feed("cut", 1)
    whole = shape.whole(_final("length"))
    assert whole["stop_reason"] == "max_tokens"
    assert (
        whole["usage"]["input_tokens"] == 72 and whole["usage"]["cache_creation_input_tokens"] == 0
    )


# --------------------------------------------------------------- Responses ----

RESPONSES_ITEM = (
    r"response\.output_item\.added "
    r"(?:response\.content_part\.added (?:response\.(?P<k>output_text|reasoning_text)\.delta )+"
    r"response\.(?:output_text|reasoning_text)\.done response\.content_part\.done "
    r"|(?:response\.function_call_arguments\.delta )+response\.function_call_arguments\.done )"
    r"response\.output_item\.done "
)
RESPONSES_ORDER = re.compile(
    rf"response\.created response\.in_progress (?:{RESPONSES_ITEM})*"
    r"response\.(?:completed|incomplete) "
)


def _body(**fields):
    base = dict(
        instructions=None,
        max_output_tokens=None,
        metadata=None,
        parallel_tool_calls=True,
        previous_response_id=None,
        reasoning=None,
        store=True,
        temperature=None,
        text=None,
        tool_choice=None,
        tools=[{"type": "function", "name": "read_file", "parameters": {"type": "object"}}],
        top_p=None,
        user=None,
    )
    return SimpleNamespace(**(base | fields))


def _responses_stream(
    text: str, reason: str = "stop", error=None, family="qwen"
) -> list[tuple[str, dict]]:
    shape = ResponseShape("0" * 32, "gpt-test", _body(), Blocks(make_parser(family)), True)
    store = ResponseStore(None, 10, 1 << 20)
    turn = Turn(shape, store, Caller("t"), [{"role": "user", "content": "q"}])
    return _sse_events(responses._events_as_sse, turn, text, reason, error)


@pytest.mark.parametrize("name", OUTPUTS)
def test_responses_events_follow_the_documented_sequence(name):
    from openai import NOT_GIVEN
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    events = _responses_stream(OUTPUTS[name])
    assert RESPONSES_ORDER.fullmatch("".join(kind + " " for kind, _ in events))
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    adapter = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=[], text_format=NOT_GIVEN)
    for kind, data in events:
        assert data["type"] == kind
        state.handle_event(adapter.validate_python(data))
    final = events[-1][1]["response"]
    response = Response.model_validate(final)
    assert response.status == "completed"
    usage = response.usage
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (200, 128)
    assert usage.total_tokens == 230
    kinds = [item.type for item in response.output]
    want = {
        "text": ["message"],
        "reasoning": ["reasoning", "message"],
        "tool use": ["reasoning", "message", "function_call"],
        "tool call alone": ["function_call"],
    }[name]
    assert kinds == want
    assert (usage.output_tokens_details.reasoning_tokens > 0) == ("reasoning" in kinds)
    assert "<" not in response.output_text, "markup leaked into text"
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == (
        [("read_file", {"path": "setup.py"})] if calls else []
    )
    ids = [item.id for item in response.output]
    assert len(set(ids)) == len(ids)


def test_responses_max_output_tokens_is_incomplete_and_a_failure_is_failed():
    from openai.types.responses import ResponseFailedEvent

    events = _responses_stream("Partial answer", "length")
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    gone = LineageError("UNAVAILABLE", "the engine went away")
    kind, data = _responses_stream("Partial", error=gone)[-1]
    failed = ResponseFailedEvent.model_validate(data)
    assert kind == "response.failed" and failed.response.status == "failed"
    assert failed.response.error.message == "the engine went away"


def test_an_anthropic_failure_mid_stream_is_an_error_event():
    gone = LineageError("UNAVAILABLE", "the engine went away")
    shape = MessageShape("r1", "claude-test", True, Blocks(make_parser("qwen")))
    kind, data = _sse_events(anthropic_messages._events_as_sse, shape, "Partial", error=gone)[-1]
    assert kind == "error" and data["error"]["type"] == "overloaded_error"


# Every family's calls (the parser cases), streamed on both wires and read back by the SDKs.
FAMILY_CALLS = [(c[0], c[1], c[2], c[5]) for c in test_parsers.CASES if c[5]]
FAMILY_CALLS += [(c[0], c[1], c[2], c[5]) for c in test_call_formats.CASES if c[5]]


@pytest.mark.parametrize("case", FAMILY_CALLS, ids=[c[0] for c in FAMILY_CALLS])
def test_the_sdks_accumulate_every_familys_streamed_calls(case):
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import RawMessageStreamEvent
    from openai import NOT_GIVEN
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    _, family, output, calls = case
    events = _anthropic_stream(output, family=family)
    assert ANTHROPIC_ORDER.fullmatch("".join(kind + " " for kind, _ in events))
    adapter, snapshot, buffers = TypeAdapter(RawMessageStreamEvent), None, {}
    for kind, data in events:
        if kind != "ping":
            event = adapter.validate_python(data)
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    uses = [(b.name, b.input) for b in snapshot.content if b.type == "tool_use"]
    assert uses == [tuple(c) for c in calls]

    events = _responses_stream(output, family=family)
    assert RESPONSES_ORDER.fullmatch("".join(kind + " " for kind, _ in events))
    adapter = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=[], text_format=NOT_GIVEN)
    for _, data in events:
        state.handle_event(adapter.validate_python(data))
        if data["type"] == "response.function_call_arguments.done":  # the SDK's own item
            item = state._output_items[data["output_index"]]
            assert item.arguments == data["arguments"]
    items = [i for i in events[-1][1]["response"]["output"] if i["type"] == "function_call"]
    assert [(i["name"], json.loads(i["arguments"])) for i in items] == [tuple(c) for c in calls]
