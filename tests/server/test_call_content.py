"""A past assistant turn with tool calls and no text reaches the chat template with content
None (as OpenAI clients send it), unless the template prints "None" for it or refuses it:
then with "". Decided per template by rendering (engine.server.prompts.renders.null_content).

The turn goes the way a request carries it: the client's dict, its wire message
(clients.wire), the engine's message (engine.server.rpc.requests), the engine's render.
"""

from __future__ import annotations

from mlx_lm.utils import load_tokenizer

from clients.wire import message_to_proto
from engine.server.prompts.renders import TemplateRenders
from engine.server.rpc.requests import _message
from tests.templates.published import published_text
from tests.tokenizers import tokenizer_dir

ASK = {"role": "user", "content": "Weather in Rome?"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call0abcd",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
        }
    ],
}
# Written here: each prints the call turn's content as it is, then its call's name.
PRINTS = (
    "{%- for m in messages -%}{{ m.role }}: {{ m.content }}"
    "{%- for c in m.tool_calls or [] %} [{{ c.function.name }}]{%- endfor %}\n{%- endfor -%}"
)
READS_A_STRING = PRINTS.replace("{{ m.content }}", "{{ m.content + '' }}")


def _renders(tmp_path, template: str) -> TemplateRenders:
    return TemplateRenders(load_tokenizer(tokenizer_dir(tmp_path, template)))


def _engine_messages(*messages) -> list[dict]:
    return [_message(message_to_proto(m, i)) for i, m in enumerate(messages)]


def test_deepseek_r1_writes_a_past_call_where_its_content_is_none(tmp_path):
    """The published DeepSeek-R1 distill template writes a turn's calls only where its
    content `is none`: with "" the call vanished from the prompt."""
    renders = _renders(tmp_path, published_text("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"))
    assert renders.null_content()
    prompt = renders.render(_engine_messages(ASK, CALL), None, True)
    assert "<｜tool▁sep｜>get_weather" in prompt and '{"city": "Rome"}' in prompt


def test_a_template_that_prints_none_gets_the_empty_string(tmp_path):
    renders = _renders(tmp_path, PRINTS)
    assert not renders.null_content()
    prompt = renders.render(_engine_messages(ASK, CALL), None, False)
    assert "None" not in prompt and "assistant:  [get_weather]" in prompt


def test_a_template_that_refuses_none_gets_the_empty_string(tmp_path):
    renders = _renders(tmp_path, READS_A_STRING)
    assert not renders.null_content()
    assert "assistant:  [get_weather]" in renders.render(_engine_messages(ASK, CALL), None, False)


def test_qwen3_reads_the_content_as_a_string_and_is_served(tmp_path):
    renders = _renders(tmp_path, published_text("Qwen-Qwen3-0.6B.jinja"))
    assert not renders.null_content()
    assert '"name": "get_weather"' in renders.render(_engine_messages(ASK, CALL), None, True)


ANSWER = {"role": "tool", "tool_call_id": "call0abcd", "content": "Sunny."}


def test_qwq_reads_an_answered_turns_content_as_a_string_and_is_served(tmp_path):
    """The published QwQ template splits the content of every assistant turn but the last:
    None passes the last turn and raises once the call is answered (a 400 for every
    agent's second request), so it is decided with the turn answered too."""
    renders = _renders(tmp_path, published_text("Qwen-QwQ-32B.jinja"))
    assert not renders.null_content()
    prompt = renders.render(_engine_messages(ASK, CALL, ANSWER), None, True)
    assert '"name": "get_weather"' in prompt and "Sunny." in prompt


def test_a_template_that_refuses_none_where_it_was_given_gets_the_empty_string(tmp_path):
    """Where None was decided and the template still refuses it (a conversation the
    decision did not render), the turn is rendered again with "", not refused."""
    renders = _renders(tmp_path, published_text("Qwen-QwQ-32B.jinja"))
    renders._null_content = True
    prompt = renders.render(_engine_messages(ASK, CALL, ANSWER), None, True)
    assert '"name": "get_weather"' in prompt and "Sunny." in prompt
