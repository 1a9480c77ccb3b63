"""A chat template that changes its own lists (Kimi K2's queue of call ids) or hands
`tojson` a generator (llama.cpp's DeepSeek-R1) renders; it still cannot change the
caller's messages, reach Python's internals, or change a set; the client's request is
refused with the template's own error where it breaks a rule."""

from __future__ import annotations

import pytest
from jinja2.exceptions import SecurityError

from engine.server.errors import InvalidRequest
from engine.server.prompts import sandbox
from engine.server.prompts.renders import TemplateRenders
from tests.tokenizers import tokenizer_dir

# Keeps a queue of the calls' names and pops one for each tool result, as Kimi K2's does.
QUEUE = (
    "{%- set queue = namespace(ids=[]) -%}{%- set seen = {} -%}"
    "{%- for m in messages -%}"
    "{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}"
    "{%- set _ = queue.ids.append(c.function.name) -%}{%- set _ = seen.update({c.id: 1}) -%}"
    "{%- endfor -%}<call {{ queue.ids | join(',') }}>"
    "{%- elif m.role == 'tool' -%}<result of {{ queue.ids.pop(0) }}>"
    "{%- else -%}<{{ m.role }}>{{ m.content }}{%- endif -%}"
    "{%- endfor -%}{{ seen | length }}"
)
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}
CONVERSATION = [
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
]


def _renders(tmp_path, template: str) -> TemplateRenders:
    from mlx_lm.utils import load_tokenizer

    return TemplateRenders(load_tokenizer(tokenizer_dir(tmp_path, template)))


def test_a_template_that_changes_its_own_lists_renders(tmp_path):
    renders = _renders(tmp_path, QUEUE)
    assert renders.render(CONVERSATION, None, False) == "<user>go<call f><result of f>1"


@pytest.mark.parametrize(
    "body",
    [
        "{%- set _ = messages.append({'role': 'x'}) -%}",
        "{%- set _ = messages[0].update({'content': 'changed'}) -%}",
        "{%- set _ = messages.pop() -%}",
    ],
)
def test_the_callers_messages_stay_as_they_were(tmp_path, body):
    renders = _renders(tmp_path, body + QUEUE)
    messages = [dict(m) for m in CONVERSATION]
    before = repr(messages)
    renders.render(messages, None, False)
    assert repr(messages) == before


@pytest.mark.parametrize(
    "body",
    [
        "{{ messages.__class__ }}",
        "{{ ().__class__.__base__.__subclasses__() }}",
        "{{ queue.ids.append.__self__ }}",
        "{%- set s = [1] | unique | list -%}{{ cycler.__init__.__globals__ }}",
    ],
)
def test_python_internals_stay_out_of_reach(tmp_path, body):
    """An underscore attribute is undefined (blank, or refused where it is called)."""
    renders = _renders(tmp_path, "{%- set queue = namespace(ids=[]) -%}" + QUEUE + body)
    try:
        text = renders.render(CONVERSATION, None, False)
    except InvalidRequest as e:
        assert "unsafe" in str(e) or "undefined" in str(e), e
    else:
        assert text == "<user>go<call f><result of f>1", text


def test_only_list_and_dict_changes_are_let_through():
    assert sandbox.refuses_mutation(
        SecurityError("access to attribute 'append' of 'list' object is unsafe.")
    )
    assert not sandbox.refuses_mutation(
        SecurityError("access to attribute 'add' of 'set' object is unsafe.")
    )
    assert not sandbox.refuses_mutation(SecurityError("access to attribute '__class__' is unsafe"))
    env = sandbox.OwnDataSandbox()
    assert env.from_string("{{ s.__class__ }}{{ s.append.__self__ }}").render(s=[1]) == ""
    with pytest.raises(SecurityError):
        env.from_string("{{ x.add(1) }}").render(x=set())
    assert env.from_string("{% set s = [] %}{{ s.append(1) or s }}").render() == "[1]"


def test_tojson_takes_what_map_makes(tmp_path):
    renders = _renders(tmp_path, "{{ tools | map(attribute='function') | tojson }}")
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert renders.render(CONVERSATION, tools, False) == '[{"name": "f"}]'
