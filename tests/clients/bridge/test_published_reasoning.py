"""A past assistant turn's reasoning, sent back on each wire (chat completions'
`reasoning_content` or vLLM's `reasoning`, an Anthropic `thinking` block, a Responses
`reasoning` item), reaches each published chat template as the turn's reasoning, never
as markup in its text: the template writes it in its model's own markup (gpt-oss's
analysis channel, Gemma 4's thought channel, Command R7B's `<|START_THINKING|>`, Qwen3's
`<think>`) or drops it, and the wires render the same prompt.

The messages go the engine's road (clients.wire's request, the server's prompt input,
the template renders), on the repository's tokenizer with each published template.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jinja2.exceptions import TemplateError
from transformers import AutoTokenizer

from clients.bridge.anthropic_request import prompt_of
from clients.bridge.responses_input import messages_of
from clients.wire import build_request
from engine.server.errors import InvalidRequest
from engine.server.prompts.renders import TemplateRenders
from engine.server.rpc.requests import to_prompt_input
from tests.templates.published import manifest, published_text
from tests.tokenizers import ASSETS

REASONING = "The user wants Paris; the tool knows."
TEXT = "Let me look that up."
ASK = "What is the weather in Paris?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "the city"}},
                "required": ["city"],
            },
        },
    }
]
ARGS = '{"city": "Paris"}'
ID = "call0abcd"  # 9 alphanumeric characters: Mistral's templates refuse any other id

# What a template writes right before a past turn's reasoning, where it reads the
# field by another name than reasoning_content or in markup other than <think>.
OWN_MARKUP = {
    "openai-gpt-oss-120b.jinja": "<|channel|>analysis<|message|>",  # `thinking`
    "google-gemma-4-31B-it.jinja": "<|channel>thought\n",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "<|START_THINKING|>",
    "upstage-Solar-Open-100B.jinja": "<|think|>",  # `reasoning`
    "LFM2.5-8B-A1B.jinja": "<think>",  # `thinking`
    "tencent-Hy3.jinja": "<think:opensource>",
    "Qwen-Qwen3-0.6B.jinja": "<think>\n",
}
# Templates that show no past reasoning: it is dropped, no markup of ours in its place.
DROPPED = [
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
]


def chat(text: str | None) -> list[dict]:
    call = {"id": ID, "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
    turn = {"role": "assistant", "content": text, "reasoning_content": REASONING}
    return [
        {"role": "user", "content": ASK},
        {**turn, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": ID, "content": "Sunny."},
    ]


def anthropic(text: str | None) -> list[dict]:
    blocks = [{"type": "thinking", "thinking": REASONING, "signature": "s"}]
    blocks += [{"type": "text", "text": text}] if text else []
    blocks.append({"type": "tool_use", "id": ID, "name": "get_weather", "input": {"city": "Paris"}})
    body = SimpleNamespace(
        system=None,
        tools=None,
        tool_choice=None,
        messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": blocks},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": ID, "content": "Sunny."}],
            },
        ],
    )
    return list(prompt_of(body).messages)


def responses(text: str | None) -> list[dict]:
    summary = [{"type": "summary_text", "text": REASONING}]
    items = [{"role": "user", "content": ASK}, {"type": "reasoning", "summary": summary}]
    if text:
        items.append({"role": "assistant", "content": [{"type": "output_text", "text": text}]})
    items.append({"type": "function_call", "call_id": ID, "name": "get_weather", "arguments": ARGS})
    items.append({"type": "function_call_output", "call_id": ID, "output": "Sunny."})
    return messages_of(items, set())


def chat_as_vllm_names_it(text: str | None) -> list[dict]:
    messages = chat(text)
    messages[1]["reasoning"] = messages[1].pop("reasoning_content")
    return messages


WIRES = {
    "chat": chat,
    "chat, vLLM's name": chat_as_vllm_names_it,
    "anthropic": anthropic,
    "responses": responses,
}


def renders(name: str) -> TemplateRenders:
    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    tokenizer.chat_template = published_text(name)
    if "bos_token" in manifest()[name]:  # the model's own; the tests' tokenizer has none
        tokenizer.bos_token = manifest()[name]["bos_token"]
    return TemplateRenders(tokenizer)


def prompt(template: TemplateRenders, messages: list[dict]) -> str:
    """The prompt the engine renders for `messages`, on the engine's road."""
    request = build_request(messages=messages, tools=TOOLS)
    return template.render(list(to_prompt_input(request).messages), TOOLS, True)


@pytest.mark.parametrize("text", [None, TEXT], ids=["calls alone", "text and calls"])
@pytest.mark.parametrize("name", sorted(manifest()))
def test_every_wire_gives_the_template_the_same_reasoning(name, text):
    template = renders(name)
    try:
        prompts = {wire: prompt(template, make(text)) for wire, make in WIRES.items()}
    except InvalidRequest as e:
        # only the template's own `raise_exception` refuses a request (Gemma 2 has no
        # system or tool turns); any other error is the engine's render failing
        if type(e.__context__) is not TemplateError:
            raise
        pytest.skip(f"the template refuses this conversation: {str(e)[:120]}")
    assert all(p == prompts["chat"] for p in prompts.values()), prompts
    rendered = prompts["chat"]
    if REASONING in rendered and "<think>" not in published_text(name):
        assert f"<think>\n{REASONING}" not in rendered  # none of our markup


@pytest.mark.parametrize("name", sorted(OWN_MARKUP))
def test_the_template_writes_the_reasoning_in_its_own_markup(name):
    for make in WIRES.values():
        rendered = prompt(renders(name), make(None))
        assert OWN_MARKUP[name] + REASONING in rendered, rendered[-600:]


def test_a_template_that_refuses_reasoning_beside_text_gets_the_turn_without_it():
    """gpt-oss raises on a call turn with both text and `thinking`: the turn goes without
    its reasoning (a 200), its text on the analysis channel as the template writes it."""
    rendered = prompt(renders("openai-gpt-oss-120b.jinja"), anthropic(TEXT))
    assert TEXT in rendered and REASONING not in rendered


@pytest.mark.parametrize("name", DROPPED)
def test_a_template_without_past_reasoning_drops_it(name):
    for make in WIRES.values():
        rendered = prompt(renders(name), make(TEXT))
        assert REASONING not in rendered and "<think>" not in rendered, rendered[-600:]
