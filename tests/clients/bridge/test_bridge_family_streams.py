"""Tool calls of the families whose markup is no JSON object in a marker (Gemma 4's own
syntax, pythonic calls that open the output with no marker, a JSON list of calls) stream
through the real bridge, gRPC server, Ray and MLX on the three wire formats: the call
starts and its arguments come in pieces before the reply ends, the pieces join to the
whole reply's arguments, and no markup reaches the text, also when max_tokens or a stop
string cuts the call.

One engine serves the random-weight model three times, each under its family's output
format (`--model NAME=PATH,output_format=F`); a named tool_choice holds it to one call in
that family's markup, written token by token by the tests' tokenizer. Each request
switches the reasoning off, as a client may on each wire.
"""

from __future__ import annotations

import dataclasses
import json

import anthropic
import pytest

from engine.config import FleetConfig, ModelSpec
from tests.clients.bridge.test_bridge import BridgeThread
from tests.engines import make_config

FAMILIES = ("gemma4", "pythonic", "phi4", "command_r")
# Reasoning switched off on each wire (Gemma's thought channel would otherwise be open to
# the random weights, which never close it): the switch reaches the grammar too.
OFF = {
    "chat": {"chat_template_kwargs": {"enable_thinking": False}},
    "anthropic": {"thinking": {"type": "disabled"}},
    "responses": {"reasoning": {"effort": "none"}},
}
ASK = "List the files, please."
ARGUMENTS = {"path": "src", "recursive": False}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files of a folder",
            "parameters": {
                "type": "object",
                "properties": {
                    # one value each, so the call closes whatever the weights want
                    "path": {"type": "string", "enum": ["src"]},
                    "recursive": {"type": "boolean", "enum": [False]},
                },
                "required": ["path", "recursive"],
            },
        },
    }
]
ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
]
MAX = 200


@pytest.fixture(scope="module")
def bridge(ray_session, tmp_path_factory, random_model_dir):
    from engine.server.running.background import BackgroundEngine

    models = tuple(ModelSpec(f, str(random_model_dir), output_format=f) for f in FAMILIES)
    config = make_config(tmp_path_factory.mktemp("families"))
    engine = BackgroundEngine(dataclasses.replace(config, fleet=FleetConfig(models=models)))
    b = BridgeThread(engine)
    yield b
    b.stop()
    engine.stop()


def _chat(bridge, family: str, max_tokens: int = MAX, **more):
    """(the whole reply, the streamed chunks' content and call pieces, finish reason)."""
    args = dict(
        **more,
        model=family,
        messages=[{"role": "user", "content": ASK}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "list_files"}},
        max_tokens=max_tokens,
        temperature=0,
        extra_body=OFF["chat"],
    )
    with bridge.client() as client:
        whole = client.chat.completions.create(**args)
        content, names, pieces, finish = [], [], [], None
        for chunk in client.chat.completions.create(stream=True, **args):
            for choice in chunk.choices:
                content.append(choice.delta.content or "")
                for call in choice.delta.tool_calls or ():
                    names += [call.function.name] if call.function.name else []
                    pieces += [call.function.arguments] if call.function.arguments else []
                finish = choice.finish_reason or finish
    return whole, "".join(content), names, pieces, finish


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_completions_streams_the_familys_call_in_pieces(bridge, family):
    whole, content, names, pieces, finish = _chat(bridge, family)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == finish == "tool_calls", message
    assert [c.function.name for c in message.tool_calls] == names == ["list_files"]
    assert json.loads(message.tool_calls[0].function.arguments) == ARGUMENTS
    assert "".join(pieces) == message.tool_calls[0].function.arguments
    assert len(pieces) > 1, f"the arguments came whole: {pieces}"
    assert not (message.content or "") and not content, "markup reached the text"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_that_max_tokens_cuts_leaks_no_markup(bridge, family):
    whole, *_ = _chat(bridge, family)
    cut = whole.usage.completion_tokens - 2
    _, content, names, pieces, finish = _chat(bridge, family, max_tokens=cut)
    assert finish == "length" and not content, content
    assert names == ["list_files"] and pieces, "the cut call streamed nothing"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_that_a_stop_string_cuts_leaks_no_markup(bridge, family):
    whole, content, names, pieces, _ = _chat(bridge, family, stop=["src"])
    assert not content and not (whole.choices[0].message.content or ""), content
    assert names == ["list_files"], "the cut call streamed nothing"
    assert [c.function.name for c in whole.choices[0].message.tool_calls] == names


@pytest.mark.parametrize("family", FAMILIES)
def test_anthropic_streams_input_json_deltas(bridge, family):
    args = dict(
        model=family,
        max_tokens=MAX,
        messages=[{"role": "user", "content": ASK}],
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "tool", "name": "list_files"},
        extra_body={"temperature": 0, **OFF["anthropic"]},
    )
    with anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0) as client:
        whole = client.messages.create(**args)
        pieces, texts = [], []
        with client.messages.stream(**args) as stream:
            for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    pieces.append(event.delta.partial_json)
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    texts.append(event.delta.text)
            streamed = stream.get_final_message()
    assert whole.stop_reason == streamed.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in streamed.content] == [
        ("tool_use", "list_files", ARGUMENTS)
    ]
    assert [(b.type, b.input) for b in whole.content] == [("tool_use", ARGUMENTS)]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == ARGUMENTS, pieces
    assert not texts, "markup reached the text"


@pytest.mark.parametrize("family", FAMILIES)
def test_responses_streams_function_call_arguments_deltas(bridge, family):
    args = dict(
        model=family,
        input=ASK,
        tools=[{"type": "function", **t["function"]} for t in TOOLS],
        tool_choice={"type": "function", "name": "list_files"},
        max_output_tokens=MAX,
        temperature=0,
        store=False,
        extra_body=OFF["responses"],
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

    assert [i.type for i in final.output] == ["function_call"], final.output
    assert calls(final) == calls(whole) and json.loads(calls(whole)[0][1]) == ARGUMENTS
    assert len(pieces) > 1 and "".join(pieces) == calls(whole)[0][1], pieces
    assert "response.output_text.delta" not in kinds, "markup reached the text"
