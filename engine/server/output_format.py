"""Which markup the served model writes its reasoning and tool calls in, decided at load.

The family (`qwen`, `glm`, `kimi`, `plain`; clients.bridge.parsers reads each) comes
from the chat template and the tokenizer's vocabulary, the way the template shows
the model its own past calls: Kimi's `<|tool_calls_section_begin|>`, GLM's
`<arg_key>`, Qwen's (and Hermes') `<tool_call>`; `<think>` tokens alone mean
Qwen-style reasoning. `-thinking` follows when the template's generation prompt
ends inside an open `<think>` (the model's output starts in its reasoning).
`--output-format` (engine.config.prompt) overrides the family. It reaches
clients through ModelInfo.output_format. It knows the tokenizer and a render
function, nothing of the model.
"""

from __future__ import annotations

from typing import Callable

from engine.config.prompt import OUTPUT_FAMILIES

THINKING = "-thinking"
_PROBE = [{"role": "user", "content": "hi"}]


def family_of(template: str, vocab) -> str:
    """The family whose markup the template and the vocabulary show."""
    if "<|tool_calls_section_begin|>" in template or "<|tool_calls_section_begin|>" in vocab:
        return "kimi"
    if "<arg_key>" in template:
        return "glm"
    if "<tool_call>" in template or "<tool_call>" in vocab:
        return "qwen"
    if "<think>" in vocab or "<think>" in template:
        return "qwen"
    return "plain"


def opens_reasoning(render: Callable[[list], str]) -> bool:
    """Whether the generation prompt ends inside an open `<think>` block."""
    try:
        text = render(list(_PROBE)).rstrip()
    except Exception:  # a template that refuses the probe: it opens nothing we can see
        return False
    return text.endswith("<think>")


def output_format(setting: str, tokenizer, render: Callable[[list], str]) -> str:
    """The format the front end announces: `setting` unless auto, else detected.

    `render(messages)`: the chat template on messages, with the generation prompt.
    """
    if setting != "auto":
        return setting
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one speaks
        template = template.get("default") or next(iter(template.values()), "")
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    family = family_of(str(template or ""), vocab)
    assert family in OUTPUT_FAMILIES, family
    if family != "plain" and opens_reasoning(render):
        return family + THINKING
    return family
