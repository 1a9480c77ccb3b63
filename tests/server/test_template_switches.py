"""A client's chat template variables reach the template: `chat_template_kwargs` on chat
completions (as vLLM and SGLang take them), Anthropic's `thinking: {type: disabled}`
and Responses' `reasoning.effort` as the templates' reasoning switches
(`enable_thinking`, gpt-oss's `reasoning_effort`).

Served through the real bridge (in process, on the session's random engine) with a
template written here that refuses every conversation, naming what it was given: the
400's message is the template's own, so it shows the variables the render received.
"""

from __future__ import annotations

import httpx
import pytest

from clients.bridge.engine_call import output_family, thinking_switches
from clients.wire import build_request
from engine.server.errors import InvalidRequest
from engine.server.rpc.requests import to_prompt_input
from tests.clients.bridge.test_bridge import BridgeThread
from tests.server.test_template_corpus import serving_template
from tests.tokenizers import tokenizer_dir

SHOWS = (
    "{{ raise_exception('given: thinking=' ~ (enable_thinking if enable_thinking is defined "
    "else 'unset') ~ ' effort=' ~ (reasoning_effort if reasoning_effort is defined "
    "else 'unset') ~ ' color=' ~ (color if color is defined else 'unset')) }}"
)
ASK = [{"role": "user", "content": "hi"}]


def test_the_switches_of_each_wire():
    assert thinking_switches(disabled=True) == {"enable_thinking": False}
    assert thinking_switches(effort="none") == {"enable_thinking": False}
    assert thinking_switches(effort="minimal") == {
        "enable_thinking": True,
        "reasoning_effort": "low",
    }
    with pytest.raises(ValueError, match="'extreme' is not one of"):
        thinking_switches(effort="extreme")
    assert output_family("qwen-thinking", {"enable_thinking": False}) == "qwen"
    assert output_family("qwen-thinking", {"enable_thinking": True}) == "qwen-thinking"


def test_the_engine_takes_the_variables_and_refuses_the_renders_own():
    inp = to_prompt_input(build_request(messages=ASK, template_kwargs={"enable_thinking": False}))
    assert inp.template_kwargs == {"enable_thinking": False}
    for bad in ({"messages": []}, {"add_generation_prompt": False}, {"not a name": 1}):
        with pytest.raises(InvalidRequest, match="chat_template_kwargs: .* cannot be set"):
            to_prompt_input(build_request(messages=ASK, template_kwargs=bad))


@pytest.fixture(scope="module")
def bridge(random_engine):
    b = BridgeThread(random_engine, in_process=True)
    yield b
    b.stop()


def _given(http, path: str, body: dict) -> str:
    reply = http.post(path, json=body)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    return message[message.index("given: ") :]


def test_each_wire_sets_the_templates_switch(random_engine, bridge, tmp_path):
    model_dir = tokenizer_dir(tmp_path / "shows", SHOWS)  # the tokenizer is all it reads
    chat = {"model": "lineage", "messages": ASK, "max_tokens": 4}
    with serving_template(random_engine, model_dir), httpx.Client(base_url=bridge.url) as http:
        default = _given(http, "/v1/chat/completions", chat)
        assert "effort=unset color=unset" in default
        kwargs = {"enable_thinking": False, "color": "blue"}
        got = _given(http, "/v1/chat/completions", {**chat, "chat_template_kwargs": kwargs})
        assert got == "given: thinking=False effort=unset color=blue"
        anthropic = {**chat, "thinking": {"type": "disabled"}}
        assert _given(http, "/v1/messages", anthropic).startswith("given: thinking=False")
        responses = {"model": "lineage", "input": "hi", "reasoning": {"effort": "high"}}
        got = _given(http, "/v1/responses", responses)
        assert got == "given: thinking=True effort=high color=unset"
        reply = http.post("/v1/responses", json={**responses, "reasoning": {"effort": "max"}})
        assert reply.status_code == 400 and "reasoning.effort" in reply.text
