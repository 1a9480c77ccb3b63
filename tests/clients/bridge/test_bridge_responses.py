"""OpenAI Responses through the official `openai` SDK against the real bridge, gRPC
server, Ray and MLX: create and stream with function tools, previous_response_id
chains that restore past the stored reply and survive a bridge restart, GET and
DELETE, tenants, evictions, and bad input named in OpenAI's shape."""

from __future__ import annotations

import openai
import pytest

from clients.bridge.app import BridgeOptions
from clients.bridge.guard import BridgeSecurity
from clients.bridge.models import ServedModels
from engine.config import Identity
from tests.clients.bridge.test_bridge import SYSTEM, BridgeThread

MODEL = "gpt-5-codex"
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


def _options(directory, **bounds) -> BridgeOptions:
    return BridgeOptions(ServedModels((), ("gpt-*",)), str(directory), **bounds)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("store") / "responses"


@pytest.fixture(scope="module")
def bridge(engine, store_dir):
    b = BridgeThread(engine.address, options=_options(store_dir))
    yield b
    b.stop()


def _client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(bridge):
    with _client(bridge.url) as c:
        yield c


def _ask(client, **kwargs):
    args = {"model": MODEL, "max_output_tokens": 6, "temperature": 0, "instructions": SYSTEM}
    return client.responses.create(**(args | kwargs))


def test_create_answers_a_response_with_its_cached_and_reasoning_tokens(client):
    first = _ask(client, input="Which tests fail?", tools=TOOLS)
    assert first.object == "response" and first.id.startswith("resp_") and first.model == MODEL
    assert first.status in ("completed", "incomplete")
    assert [item.type for item in first.output] == ["message"] and first.output_text
    usage = first.usage
    assert usage.input_tokens > 600 and 1 <= usage.output_tokens <= 6
    assert usage.output_tokens_details.reasoning_tokens == 0  # the tiny model does not reason
    second = _ask(client, input="Read setup.py, please.", tools=TOOLS)
    assert second.usage.input_tokens_details.cached_tokens > 0, "the shared prefix was not reused"
    assert client.responses.retrieve(first.id).output_text == first.output_text


def test_a_stream_chained_by_previous_response_id_restores_past_the_stored_reply(client):
    turn = _ask(client, input="Start a conversation.", tools=TOOLS)
    for text in ("Go on.", "And then?"):
        with client.responses.stream(
            model=MODEL,
            input=text,
            instructions=SYSTEM,
            tools=TOOLS,
            previous_response_id=turn.id,
            max_output_tokens=6,
            temperature=0,
        ) as stream:
            events = list(stream)
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[0].type == "response.created" and events[1].type == "response.in_progress"
        assert events[-1].type in ("response.completed", "response.incomplete")
        latest = events[-1].response
        assert latest.previous_response_id == turn.id
        # The whole earlier prompt came from the cache. Its reply does too when its text
        # tokenizes back to the ids the model drew; the tiny random model's seldom does,
        # and then the restore is the prompt end (a reply checkpoint).
        restored = latest.usage.input_tokens_details.cached_tokens
        assert restored >= turn.usage.input_tokens, latest.usage
        turn = latest


def test_function_call_items_and_their_outputs_are_rendered(client):
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "read_file",
        "arguments": '{"path": "a"}',
    }
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Read a."}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Read it."}],
        },
        call,
        {"type": "function_call_output", "call_id": "call_1", "output": "print('hi')"},
    ]
    reply = _ask(client, input=items, tools=TOOLS)
    plain = _ask(client, input=items[:1], tools=TOOLS)
    assert reply.usage.input_tokens > plain.usage.input_tokens + 15
    follow = _ask(
        client,
        input=[{"type": "function_call_output", "call_id": "call_1", "output": "again"}],
        previous_response_id=reply.id,
        tools=TOOLS,
    )
    assert follow.usage.input_tokens > reply.usage.input_tokens


NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Start a sub-agent",
            "parameters": {
                "type": "object",
                "properties": {"task": {"type": "string"}},
                "required": ["task"],
            },
        }
    ],
}
HOSTED = [{"type": "web_search", "external_web_access": False}, {"type": "file_search"}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_namespaced_call_comes_back_namespaced_and_hosted_tools_are_left_out(client, stream):
    """Codex CLI's tools: a namespace of functions and a hosted web search, answered 200;
    a call forced to the namespaced function comes back as `name` + `namespace`, and the
    hosted tools are named in a header, not in the prompt."""
    choice = {"type": "function", "name": "spawn_agent", "namespace": "multi_agent_v1"}
    args = dict(
        input="Spawn one.",
        tools=TOOLS + [NAMESPACE] + HOSTED,
        tool_choice=choice,
        max_output_tokens=160,
        temperature=0,
        store=False,
        include=["reasoning.encrypted_content"],
        reasoning={"summary": "auto"},
        prompt_cache_key="thread-1",
        extra_body={"client_metadata": {"originator": "codex_exec"}},
    )
    if stream:
        with client.responses.with_streaming_response.create(stream=True, **args) as raw:
            assert raw.headers["x-lineage-tools-left-out"] == "web_search, file_search"
            ends = ("response.completed", "response.incomplete")
            done = [e for e in raw.parse() if e.type in ends]
        reply = done[0].response
    else:
        raw = client.responses.with_raw_response.create(**args)
        assert raw.headers["x-lineage-tools-left-out"] == "web_search, file_search"
        reply = raw.parse()
    calls = [item for item in reply.output if item.type == "function_call"]
    assert calls and calls[0].name == "spawn_agent", reply.output
    assert calls[0].namespace == "multi_agent_v1"
    # sent back as Codex sends it: the model reads its own call under the name it was offered
    back = {"type": "function_call", "call_id": calls[0].call_id, "name": "spawn_agent"}
    back |= {"namespace": "multi_agent_v1", "arguments": calls[0].arguments}
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "ok"}
    again = _ask(
        client,
        input=[{"role": "user", "content": "Spawn one."}, back, output],
        tools=TOOLS + [NAMESPACE] + HOSTED,
        store=False,
    )
    assert again.status in ("completed", "incomplete")
    plain = _ask(client, input="Spawn one.", tools=TOOLS, store=False)
    assert again.usage.input_tokens > plain.usage.input_tokens + 30  # the namespace's tool


def test_a_stored_response_survives_a_bridge_restart(engine, tmp_path):
    directory = tmp_path / "responses"
    b = BridgeThread(engine.address, options=_options(directory))
    try:
        with _client(b.url) as c:
            first = _ask(c, input="Remember this turn.")
    finally:
        b.stop()
    b = BridgeThread(engine.address, options=_options(directory))  # a new process's store
    try:
        with _client(b.url) as c:
            assert c.responses.retrieve(first.id).output_text == first.output_text
            follow = _ask(c, input="Still there?", previous_response_id=first.id)
            assert follow.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
            c.responses.delete(first.id)
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(first.id)
    finally:
        b.stop()


def test_another_tenants_id_is_404_revealing_nothing_and_an_evicted_one_says_so(engine, tmp_path):
    security = BridgeSecurity(
        (Identity("tok-alice", "alice"), Identity("tok-bob", "bob")), allow_open_engine=True
    )
    b = BridgeThread(engine.address, security, _options(tmp_path / "r", store_max=2))
    try:
        with _client(b.url, "tok-alice") as alice, _client(b.url, "tok-bob") as bob:
            mine = [_ask(alice, input=f"Turn {i}.", max_output_tokens=2) for i in range(3)]
            for call in (
                lambda: bob.responses.retrieve(mine[2].id),
                lambda: _ask(bob, input="x", previous_response_id=mine[2].id),
                lambda: bob.responses.retrieve(mine[0].id),  # evicted, but not bob's to know
            ):
                with pytest.raises(openai.NotFoundError) as error:
                    call()
                assert "evicted" not in error.value.message and "alice" not in error.value.message
            with pytest.raises(openai.NotFoundError) as error:
                _ask(alice, input="x", previous_response_id=mine[0].id)
            assert "evicted" in error.value.message
            assert error.value.body["param"] == "previous_response_id"
            assert alice.responses.retrieve(mine[2].id).id == mine[2].id
    finally:
        b.stop()


BAD = [
    ("an unknown item", {"input": [{"type": "video_clip"}]}, "input[0].type"),
    (
        "an image on a text-only model",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content[0]: input_image needs a vision model",
    ),
    (
        "an output answering no call",
        {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
        "input[0].call_id",
    ),
    (
        "a forced hosted tool",
        {"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
        "tool_choice: it forces 'web_search'",
    ),
    (
        "a schema the engine cannot enforce",
        {
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "t",
                    "schema": {"type": "array", "uniqueItems": True},
                }
            }
        },
        "'uniqueItems' at #/uniqueItems",
    ),
    ("background", {"background": True}, "background"),
    ("max_output_tokens", {"max_output_tokens": 0}, "max_output_tokens"),
]


@pytest.mark.parametrize("override,needle", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_bad_input_is_400_naming_the_field_and_the_bridge_keeps_serving(
    client, override, needle, stream
):
    args = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "stream": stream} | override
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(**args)
    assert needle in error.value.message and error.value.body["type"] == "invalid_request_error"
    served = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    # served, whatever it says: the trained model may end its reply at once
    assert served.status in ("completed", "incomplete") and served.usage.input_tokens > 0


def test_model_names_are_served_aliased_or_404_and_listed(client):
    assert (
        client.responses.create(model="lineage", input="hi", max_output_tokens=2).model == "lineage"
    )
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(model="claude-opus", input="hi", max_output_tokens=2)
    assert "lineage" in error.value.message and error.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="claude-opus", messages=[{"role": "user", "content": "x"}]
        )
    listed = {m.id for m in client.models.list().data}
    assert {"lineage", "gpt-*"} <= listed
