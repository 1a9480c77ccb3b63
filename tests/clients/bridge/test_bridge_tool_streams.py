"""A tool call streamed through the real bridge, gRPC server, Ray and MLX, on the three
wire formats, read by the official SDKs' own stream accumulators: the call they build
equals the one the same request answers whole, and its arguments came in pieces.

The call is forced (a named tool_choice) so the embedded model writes one; at
temperature 0 the streamed and the whole request write the same tokens.
"""

from __future__ import annotations

import json

import anthropic
import pytest

from clients.bridge.app import BridgeOptions
from clients.bridge.models import ServedModels
from tests.clients.bridge.test_bridge import TOOLS, BridgeThread

ASK = "Read setup.py, please."
MAX = 160


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
        max_tokens=MAX,
        temperature=0,
    )
    with bridge.client() as client:
        whole = client.chat.completions.create(**args).choices[0].message.tool_calls
        pieces = []
        with client.chat.completions.stream(**args) as stream:
            for event in stream:
                if event.type == "tool_calls.function.arguments.delta":
                    pieces.append(event.arguments_delta)
            streamed = stream.get_final_completion().choices[0].message.tool_calls
    assert whole and [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in whole
    ]
    assert "".join(pieces) == whole[0].function.arguments
    assert len(pieces) > 1, "the arguments came whole"
    json.loads(whole[0].function.arguments)


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
                    pieces.append(event.delta.partial_json)
            streamed = stream.get_final_message()

    def uses(message):
        return [(b.name, b.input) for b in message.content if b.type == "tool_use"]

    assert uses(whole) and uses(streamed) == uses(whole)
    assert json.loads("".join(pieces)) == uses(whole)[0][1]
    assert len(pieces) > 1, "the input came whole"


def test_responses_streams_function_call_arguments_deltas(bridge):
    args = dict(
        model="gpt-test",
        input=ASK,
        tools=[{"type": "function", **t["function"]} for t in TOOLS],
        tool_choice={"type": "function", "name": "read_file"},
        max_output_tokens=MAX,
        temperature=0,
        store=False,
    )
    with bridge.client() as client:
        whole = client.responses.create(**args)
        pieces, kinds = [], []
        with client.responses.stream(**args) as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.function_call_arguments.delta":
                    pieces.append(event.delta)
            streamed = stream.get_final_response()

    def calls(response):
        return [(i.name, i.arguments) for i in response.output if i.type == "function_call"]

    assert calls(whole) and calls(streamed) == calls(whole)
    assert "".join(pieces) == calls(whole)[0][1]
    assert len(pieces) > 1, "the arguments came whole"
    at = kinds.index("response.function_call_arguments.delta")
    assert kinds[at - 1] == "response.output_item.added"
    assert kinds[at + len(pieces) :][:2] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
