"""Anthropic Messages through the official `anthropic` SDK against the real bridge, gRPC
server, Ray and MLX: create, stream with tools through a tool loop, count_tokens, the
errors in Anthropic's shape, ping events during a long prefill, model aliases."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from clients.bridge.app import BridgeOptions
from clients.bridge.guard import BridgeSecurity
from clients.bridge.models import ServedModels
from engine.config import Identity
from tests.clients.bridge.test_bridge import SYSTEM, BridgeThread

MODEL = "claude-sonnet-4-5"
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the repository",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
HELLO = [{"role": "user", "content": "Say something about prompt caches."}]


@pytest.fixture(scope="module")
def bridge(engine, tmp_path_factory):
    options = BridgeOptions(
        ServedModels((), ("claude-*",)), str(tmp_path_factory.mktemp("store") / "responses")
    )
    b = BridgeThread(engine.address, options=options)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def client(bridge):
    with anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0) as c:
        yield c


def _total(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_create_answers_a_message_whose_usage_adds_up_to_the_prompt(client):
    reply = client.messages.create(
        model=MODEL, max_tokens=8, messages=HELLO, extra_body={"temperature": 0}
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == MODEL and reply.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text
    assert 1 <= reply.usage.output_tokens <= 8
    again = client.messages.create(
        model=MODEL, max_tokens=8, messages=HELLO, extra_body={"temperature": 0}
    )
    assert again.content[0].text == reply.content[0].text  # greedy
    assert _total(again.usage) == _total(reply.usage) > 5
    assert again.usage.cache_read_input_tokens > 0, "a resend restored nothing"
    count = client.messages.count_tokens(model=MODEL, messages=HELLO)
    assert count.input_tokens == _total(reply.usage)


def test_a_tool_loop_streams_and_reuses_the_cache_turn_after_turn(client):
    """Three turns as a tool-using agent sends them: the system prompt and tools, the
    model's tool_use (with its thinking) and the tool's result, then a last question."""
    system = [
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer in one line."},
    ]
    history = [{"role": "user", "content": "What does setup.py say?"}]
    turns = [
        [],
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should read it.", "signature": "s"},
                    {"type": "text", "text": "Reading it."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "read_file",
                        "input": {"path": "setup.py"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print('hi')"},
                    {"type": "text", "text": "Summarize it."},
                ],
            },
        ],
        [{"role": "assistant", "content": "It prints hi."}, {"role": "user", "content": "Thanks."}],
    ]
    usages = []
    for new in turns:
        history += new
        with client.messages.stream(
            model=MODEL,
            max_tokens=6,
            system=system,
            tools=TOOLS,
            messages=history,
            extra_body={"temperature": 0},
        ) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
        usages.append(final.usage)
    prompts = [_total(u) for u in usages]
    assert prompts[0] > 600 and prompts[1] > prompts[0] + 20 and prompts[2] > prompts[1]
    assert all(u.cache_read_input_tokens > 0 for u in usages[1:]), usages
    assert usages[2].cache_read_input_tokens >= prompts[0], "turn 3 did not restore past turn 1"


def test_a_long_prefill_sends_pings(bridge):
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "stream": True,
        "system": SYSTEM + "\nPings.",
        "messages": HELLO,
    }
    with httpx.stream("POST", f"{bridge.url}/v1/messages", json=body, timeout=120) as reply:
        events = [line[7:] for line in reply.iter_lines() if line.startswith("event: ")]
    assert events[0] == "message_start" and "ping" in events and events[-1] == "message_stop"


BAD = [
    (
        "an unknown block",
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        "messages[0].content[0].type",
    ),
    (
        "an image on a text-only model",
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        "messages[0].content[0]: image blocks need a vision model",
    ),
    (
        "a tool_result answering nothing",
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "b", "content": "x"}],
                },
            ]
        },
        "messages[1].content[0].tool_use_id",
    ),
    ("a role", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    (
        "a server tool",
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "tools[0].type",
    ),
    ("no max_tokens", {"max_tokens": 0}, "max_tokens"),
]


@pytest.mark.parametrize("override,needle", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_bad_input_is_400_in_anthropics_shape_naming_the_field(client, override, needle, stream):
    args = {"model": MODEL, "max_tokens": 2, "messages": HELLO, "stream": stream} | override
    with pytest.raises(anthropic.BadRequestError) as error:
        client.messages.create(**args)
    assert error.value.status_code == 400
    assert error.value.body["type"] == "error"
    assert error.value.body["error"]["type"] == "invalid_request_error"
    assert needle in error.value.body["error"]["message"]
    served = client.messages.create(model=MODEL, max_tokens=2, messages=HELLO)
    assert served.stop_reason in ("end_turn", "max_tokens")  # the trained model may end at once


def test_an_unknown_model_is_404_naming_the_served_ones(client):
    with pytest.raises(anthropic.NotFoundError) as error:
        client.messages.create(model="gpt-4o", max_tokens=2, messages=HELLO)
    assert error.value.body["error"]["type"] == "not_found_error"
    assert (
        "lineage" in error.value.body["error"]["message"]
        and "claude-*" in error.value.body["error"]["message"]
    )


def test_engine_failures_are_anthropics_429_and_529(engine, client):
    frontend = engine.engine.frontend
    frontend.max_queue = 0
    try:
        with pytest.raises(anthropic.RateLimitError) as error:
            client.messages.create(model=MODEL, max_tokens=2, messages=HELLO)
        assert error.value.body["error"]["type"] == "rate_limit_error"
    finally:
        frontend.max_queue = 256
    down = BridgeThread("127.0.0.1:1")  # nothing listens there
    try:
        with anthropic.Anthropic(base_url=down.url, api_key="x", max_retries=0) as c:
            with pytest.raises(anthropic.APIStatusError) as error:
                c.messages.create(model="lineage", max_tokens=2, messages=HELLO)
        assert error.value.status_code == 529
        assert error.value.body["error"]["type"] == "overloaded_error"
    finally:
        down.stop()


def test_the_token_comes_as_x_api_key_or_bearer_and_413_is_anthropic_shaped(engine):
    security = BridgeSecurity(
        (Identity("tok-alice", "alice"),), max_body_bytes=4096, allow_open_engine=True
    )
    b = BridgeThread(engine.address, security=security)
    try:
        for kwargs in ({"api_key": "tok-alice"}, {"auth_token": "tok-alice"}):
            with anthropic.Anthropic(base_url=b.url, max_retries=0, **kwargs) as c:
                served = c.messages.create(model="lineage", max_tokens=2, messages=HELLO)
                assert served.stop_reason in ("end_turn", "max_tokens")
        with anthropic.Anthropic(base_url=b.url, api_key="wrong", max_retries=0) as c:
            with pytest.raises(anthropic.AuthenticationError) as error:
                c.messages.create(model="lineage", max_tokens=2, messages=HELLO)
            assert error.value.body["error"]["type"] == "authentication_error"
        big = {
            "model": "lineage",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "x" * 8000}],
        }
        reply = httpx.post(f"{b.url}/v1/messages", json=big, headers={"x-api-key": "tok-alice"})
        assert reply.status_code == 413
        assert json.loads(reply.text)["error"]["type"] == "request_too_large"
    finally:
        b.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_stop_sequence_is_named_as_the_reason_and_the_text_ends_before_it(client, stream):
    free = client.messages.create(
        model=MODEL, max_tokens=24, messages=HELLO, extra_body={"temperature": 0}
    )
    text = "".join(b.text for b in free.content if b.type == "text")
    assert len(text.strip()) > 2, f"the model's greedy reply is too short to cut: {text!r}"
    stop = text.strip()[1:3]  # two characters the greedy reply holds: it stops there
    args = {"model": MODEL, "max_tokens": 24, "messages": HELLO, "stop_sequences": ["\x00", stop]}
    if stream:
        with client.messages.stream(**args, extra_body={"temperature": 0}) as events:
            reply = events.get_final_message()
    else:
        reply = client.messages.create(**args, extra_body={"temperature": 0})
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    cut = "".join(b.text for b in reply.content if b.type == "text")
    assert stop not in cut and text.startswith(cut)
