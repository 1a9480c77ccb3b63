"""Structured output through the bridge (on the session's random-weight model) and gRPC.

The official openai SDK against the bridge (in process, and over gRPC where the
path differs): `response_format` json_schema (the SDK's `parse` with a pydantic
model) and json_object, `tool_choice` required and named, at temperature 1
where unconstrained output is garbage. Bad input is a 400 (INVALID_ARGUMENT
over gRPC) naming the field, and the server serves the next request.
"""

from __future__ import annotations

import json
from typing import Literal

import grpc
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from clients.constraints import Constraint, constraint_for
from clients.wire import InvalidInput, build_request
from engine.proto import engine_pb2
from tests.clients.bridge.test_bridge import BridgeThread

pytestmark = pytest.mark.ray

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 16}},
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module", params=["in_process", "grpc"])
def bridge(random_engine, request):
    b = BridgeThread(random_engine, in_process=request.param == "in_process")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def client(bridge):
    with bridge.client() as c:
        yield c


class Forecast(BaseModel):
    city: str = Field(max_length=10)
    unit: Literal["c", "f"]
    days: int = Field(ge=1, le=7)
    windy: bool


def test_the_sdk_parses_a_pydantic_model(client):
    for seed in range(3):
        r = client.chat.completions.parse(
            model="lineage",
            messages=USER,
            response_format=Forecast,
            temperature=1.0,
            seed=seed,
            max_tokens=200,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Forecast)


def test_json_object_gives_an_object(client):
    r = client.chat.completions.create(
        model="lineage",
        messages=USER,
        response_format={"type": "json_object"},
        temperature=1.0,
        seed=3,
        max_tokens=120,
    )
    if r.choices[0].finish_reason == "stop":  # an object may run past max_tokens
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "search"}}]
)
def test_tool_choice_required_and_named_give_valid_calls(client, choice):
    for seed in range(3):
        r = client.chat.completions.create(
            model="lineage",
            messages=USER,
            tools=TOOLS,
            tool_choice=choice,
            temperature=1.0,
            seed=seed,
            max_tokens=200,
        )
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and message.tool_calls, message
        for call in message.tool_calls:
            if isinstance(choice, dict):
                assert call.function.name == "search"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_parallel_tool_calls_false_gives_one_call(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model="lineage",
            messages=USER,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=200,
        )
        assert len(r.choices[0].message.tool_calls) == 1


def test_tool_choice_none_writes_no_call(client):
    r = client.chat.completions.create(
        model="lineage",
        messages=USER,
        tools=TOOLS,
        tool_choice="none",
        temperature=1.0,
        seed=1,
        max_tokens=60,
    )
    assert not r.choices[0].message.tool_calls
    assert "<tool_call>" not in (r.choices[0].message.content or "")


def test_a_schema_cut_by_max_tokens_ends_with_length(client):
    r = client.chat.completions.create(
        model="lineage",
        messages=USER,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
        },
        max_tokens=1,
        temperature=1.0,
    )
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs,named",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "t",
                        "schema": {
                            "type": "object",
                            "properties": {"tags": {"type": "array", "uniqueItems": True}},
                        },
                    },
                }
            },
            ["uniqueItems", "#/properties/tags/uniqueItems"],
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 7}}}},
            ["json_schema"],
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            ["tool_choice", "nope"],
        ),
        ({"response_format": {"type": "yaml"}}, ["response_format.type"]),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, ["tool_choice"]),
    ],
)
def test_bad_input_is_a_400_naming_the_field(client, kwargs, named):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="lineage", messages=USER, max_tokens=4, temperature=0, **kwargs
        )
    for word in named:
        assert word in str(e.value), e.value
    ok = client.chat.completions.create(model="lineage", messages=USER, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")  # still serving


def test_grpc_carries_the_constraint_and_refuses_what_it_cannot_enforce(stub, engine):
    schema = {"type": "object", "properties": {"k": {"enum": ["v", "w"]}}, "required": ["k"]}
    request = build_request(
        messages=USER,
        max_tokens=40,
        temperature=1.0,
        seed=5,
        constraint=Constraint(json_schema=json.dumps(schema), strict=True),
    )
    events = list(stub.Generate(request, timeout=60))
    text = "".join(e.chunk.text for e in events if e.HasField("chunk"))
    final = events[-1].final
    assert final.finish_reason == "stop" and not final.incomplete
    jsonschema.validate(json.loads(text), schema)

    bad = build_request(
        messages=USER,
        max_tokens=4,
        constraint=engine_pb2.Constraint(json_schema='{"if": {}, "then": {}}'),
    )
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Generate(bad, timeout=60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'if'" in e.value.details() and "#/if" in e.value.details()
    lark = build_request(
        prompt="x", max_tokens=8, constraint=engine_pb2.Constraint(lark='start: "yes" | "no"')
    )
    events = list(stub.Generate(lark, timeout=60))
    assert "".join(e.chunk.text for e in events if e.HasField("chunk")) in ("yes", "no")


def test_constraint_for_reads_every_wire_shape():
    schema = {"type": "object"}
    chat = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    flat = {"type": "json_schema", "name": "n", "schema": schema, "strict": True}
    assert (
        constraint_for(chat)
        == constraint_for(flat)
        == Constraint(json_schema='{"type": "object"}', strict=True)
    )
    assert constraint_for({"type": "text"}) is None
    assert constraint_for(None, {"type": "any"}, tools=TOOLS).tool_choice == "required"
    named = constraint_for(
        None, {"type": "tool", "name": "search", "disable_parallel_tool_use": True}
    )
    assert (named.tool_choice, named.tool_name, named.single_call) == ("function", "search", True)
    assert constraint_for(None, {"type": "function", "name": "search"}).tool_name == "search"
    assert constraint_for(None, None, tools=TOOLS).tool_choice == "auto"
    assert constraint_for(None, None, tools=None) is None
    with pytest.raises(InvalidInput, match="tool_choice"):
        constraint_for(chat, "required", tools=TOOLS)


def test_responses_text_format_holds_the_output_to_its_schema(client):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "n": {"enum": [1, 2]}},
        "required": ["city", "n"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    for seed in range(2):
        r = client.responses.create(
            model="lineage",
            input="Where?",
            text={"format": fmt},
            temperature=1.0,
            max_output_tokens=120,
            extra_body={"seed": seed},
        )
        assert r.status == "completed"
        jsonschema.validate(json.loads(r.output_text), schema)


def test_anthropic_any_and_tool_give_valid_tool_use(bridge):
    import anthropic

    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
    ]
    with anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0) as c:
        one = {"disable_parallel_tool_use": True}  # one call: well within max_tokens
        for choice in ({"type": "any"} | one, {"type": "tool", "name": "get_weather"} | one):
            r = c.messages.create(
                model="lineage",
                max_tokens=200,
                messages=USER,
                tools=tools,
                tool_choice=choice,
                extra_body={"temperature": 1.0},
            )
            uses = [b for b in r.content if b.type == "tool_use"]
            assert r.stop_reason == "tool_use" and len(uses) == 1, r.content
            for use in uses:
                assert choice["type"] == "any" or use.name == "get_weather"
                jsonschema.validate(use.input, SCHEMAS[use.name])


def test_a_tool_loop_under_auto_gets_only_valid_calls(client):
    """`tool_choice: auto` (the lazy grammar): whatever the random model writes, every call it
    opens parses and validates; each is answered and the loop goes on."""
    messages = list(USER)
    for turn in range(4):
        r = client.chat.completions.create(
            model="lineage",
            messages=messages,
            tools=TOOLS,
            temperature=1.0,
            seed=turn,
            max_tokens=150,
        )
        message = r.choices[0].message
        assert "<tool_call>" not in (message.content or "")  # a call that did not parse
        for call in message.tool_calls or ():
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "ok"})
        messages.append({"role": "user", "content": "And then?"})
