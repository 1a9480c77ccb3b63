"""A tool call streamed through the real bridge, gRPC server, Ray and MLX, on the three
wire formats, read by the official SDKs (chat's ChatCompletionStreamState, Anthropic's
messages.stream, the Responses stream's typed events): the call they build equals the
one the same request answers whole, and its arguments came in pieces.

The call is forced (a named tool_choice) so the embedded model writes one; at
temperature 0 the streamed and the whole request write the same tokens.
"""

from __future__ import annotations

import json

import anthropic
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from clients.bridge.app import BridgeOptions
from clients.bridge.models import ServedModels
from tests.clients.bridge.test_bridge import BridgeThread

ASK = "Read setup.py, please."
MAX = 400
# One value the grammar allows, so the call closes within MAX (the model's spacing is free).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "enum": ["setup.py"]}},
                "required": ["path"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def bridge(engine, tmp_path_factory):
    options = BridgeOptions(
        ServedModels((), ("claude-*", "gpt-*")), str(tmp_path_factory.mktemp("store") / "r")
    )
    b = BridgeThread(engine.address, options=options)
    yield b
    b.stop()


def test_chat_completions_streams_the_arguments_in_pieces(bridge):
    args = dict(
        model="lineage",
        messages=[{"role": "user", "content": ASK}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "read_file"}},
        parallel_tool_calls=False,
        max_tokens=MAX,
        temperature=0,
    )
    with bridge.client() as client:
        whole = client.chat.completions.create(**args).choices[0].message.tool_calls
        state, pieces = ChatCompletionStreamState(), []
        for chunk in client.chat.completions.create(stream=True, **args):
            state.handle_chunk(chunk)
            for call in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
                if call.function and call.function.arguments:
                    pieces.append((call.index, call.function.arguments))
        streamed = state.current_completion_snapshot.choices[0].message.tool_calls
    assert len(whole) == 1 and [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in whole
    ]
    assert "".join(p for i, p in pieces if i == 0) == whole[0].function.arguments
    assert len(pieces) > 1, "the arguments came whole"
    assert json.loads(whole[0].function.arguments) == {"path": "setup.py"}


def test_anthropic_streams_input_json_deltas(bridge):
    args = dict(
        model="claude-sonnet-4-5",
        max_tokens=MAX,
        messages=[{"role": "user", "content": ASK}],
        tools=[
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in TOOLS
        ],
        tool_choice={"type": "tool", "name": "read_file"},
        extra_body={"temperature": 0},
    )
    with anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0) as client:
        whole = client.messages.create(**args)
        pieces = []
        with client.messages.stream(**args) as stream:
            for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    pieces.append((event.index, event.delta.partial_json))
            streamed = stream.get_final_message()

    # a named tool is one call, parallel calls allowed or not: the reply stops after it
    assert whole.stop_reason == streamed.stop_reason == "tool_use"
    assert [b.type for b in whole.content] == [b.type for b in streamed.content] == ["tool_use"]
    assert len(pieces) > 1 and {i for i, _ in pieces} == {0}, "the input came whole"
    assert json.loads("".join(p for _, p in pieces)) == {"path": "setup.py"}
    assert streamed.content[0].name == whole.content[0].name == "read_file"
    assert streamed.content[0].input == whole.content[0].input == {"path": "setup.py"}


def test_anthropic_any_without_parallel_calls_is_one_call(bridge):
    """`tool_choice: {type: any, disable_parallel_tool_use: true}` holds the reply to one
    call: it stops after it."""
    with anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0) as client:
        reply = client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=MAX,
            messages=[{"role": "user", "content": ASK}],
            tools=[
                {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                for t in TOOLS
            ],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"temperature": 0},
        )
    assert reply.stop_reason == "tool_use", reply
    assert [(b.type, b.input) for b in reply.content if b.type == "tool_use"] == [
        ("tool_use", {"path": "setup.py"})
    ]


def test_responses_streams_function_call_arguments_deltas(bridge):
    args = dict(
        model="gpt-test",
        input=ASK,
        tools=[{"type": "function", **t["function"]} for t in TOOLS],
        tool_choice={"type": "function", "name": "read_file"},
        parallel_tool_calls=False,
        max_output_tokens=MAX,
        temperature=0,
        store=False,
    )
    with bridge.client() as client:
        whole = client.responses.create(**args)
        pieces, kinds, final = [], [], None
        for event in client.responses.create(stream=True, **args):
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                pieces.append(event.delta)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response

    def calls(response):
        return [(i.name, i.arguments) for i in response.output if i.type == "function_call"]

    assert len(calls(whole)) == 1 and calls(final) == calls(whole)
    assert "".join(pieces) == calls(whole)[0][1]
    assert json.loads(calls(whole)[0][1]) == {"path": "setup.py"}
    assert len(pieces) > 1, "the arguments came whole"
    at = kinds.index("response.function_call_arguments.delta")
    assert kinds[at - 1] == "response.output_item.added"
    assert kinds[at + len(pieces) :][:2] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
