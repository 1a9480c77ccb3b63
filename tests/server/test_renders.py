"""The engine's own renders never fail a request: on a template that refuses every partial
conversation, the client's render still answers, each lost analysis is counted by kind,
and the template's error is logged once per kind."""

from __future__ import annotations

import logging

import pytest

from engine.server.errors import InvalidRequest
from engine.server.prompts.prompt import PromptBuilder, PromptInput
from engine.server.prompts.renders import with_text_arguments
from tests.tokenizers import tokenizer_dir

# Renders only a conversation whose last message is the user's "go": every analysis render
# (a prefix, a placeholder, the head) is refused, the client's whole conversation is not.
PICKY = (
    "{%- if not messages or messages[-1].content != 'go' -%}"
    "{{ raise_exception('only whole conversations') }}{%- endif -%}"
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
TOOLS = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)


@pytest.fixture(scope="module")
def picky(tmp_path_factory):
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(tokenizer_dir(tmp_path_factory.mktemp("picky"), PICKY))


def test_analysis_is_lost_counted_and_logged_once_but_the_request_is_served(picky, caplog):
    caplog.set_level(logging.WARNING, logger="engine.server.prompts.renders")
    builder = PromptBuilder(picky, 1 << 20, 1 << 20)
    messages = (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "go"},
    )
    for _ in range(2):
        p = builder.build(PromptInput(messages=messages, tools=TOOLS))
    assert p.tokens and p.anchor_len == 0
    assert len(set(p.layout.starts)) == 1  # no boundary found: one message for the analysis
    assert builder.renders.failures["anchor"] == 2
    assert builder.renders.failures["layout"] >= 4  # each unknown start, each request
    # The probe of the generation prompt failed too: the family (from the vocabulary) stands,
    # without "-thinking".
    assert builder.output_format == "qwen" and builder.renders.failures["probe"] == 1
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3 and all("only whole conversations" in m for m in logged)
    with pytest.raises(InvalidRequest, match="only whole conversations"):  # the client's own
        builder.build(PromptInput(messages=messages[:2], tools=TOOLS))


def test_past_arguments_become_text_only_where_they_are_a_mapping():
    call = {"function": {"name": "f", "arguments": {"a": 1}}}
    text = {"function": {"name": "f", "arguments": '{"a": 1}'}}
    messages = [{"role": "assistant", "tool_calls": [call]}]
    assert with_text_arguments(messages) == [{"role": "assistant", "tool_calls": [text]}]
    assert with_text_arguments([{"role": "assistant", "tool_calls": [text]}]) is None
