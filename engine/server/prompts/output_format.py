"""Which markup the served model writes its reasoning and tool calls in, decided at load.

The family (engine.config.prompt.OUTPUT_FAMILIES; clients.bridge.parsers reads each)
comes from the chat template, the way it shows the model its own past calls: each
family's marks, checked in `_SHOWN`'s order (Kimi's `<|tool_calls_section_begin|>`,
DeepSeek's `<｜tool▁calls▁begin｜>` and `｜DSML｜`, GLM's `<arg_key>`, gpt-oss's
channels, Gemma 4's `<|tool_call>`, MiniMax's, Nemotron's `<TOOLCALL>`, Command-R's,
Mistral's `[TOOL_CALLS]`, Phi-4's `functools[`, Granite's `<|tool_call|>`, Apertus'
`<|tools_prefix|>`, Apriel's `<tool_calls>` after `[BEGIN FINAL RESPONSE]`, Seed-OSS's
`<seed:tool_call>`, GigaChat 3.1's `<|function_call|>` and 3's `function call` role,
LFM2's `<|tool_call_start|>`, Solar Open's `<|tool_call:begin|>`, Qwen3-Coder's
`<function=…><parameter=…>`, Qwen's and Hermes' `<tool_call>`, Llama 4's `<|python_start|>`,
Llama 3's `<|python_tag|>` or its `"parameters": ` JSON); else from the vocabulary's
tokens (`_HELD`); else `<think>` alone means Qwen-style reasoning. `-thinking` follows
when the template's generation prompt ends inside an open `<think>`, or the family's own
opener (`_REASONING`: Apriel 1.6's `Here are my reasoning steps:`): the model's output
starts in its reasoning.
`--output-format` (engine.config.prompt) overrides the family. It reaches
clients through ModelInfo.output_format.

The same markup is not always one token: Qwen's tokenizers hold `<tool_call>`
as an added token, many Hermes-style fine-tunes and converted models spell it
in ordinary BPE pieces. `special_markers(tokenizer)` says which markers are
added tokens, so the grammars (engine.runtime.structured.grammar) match each as the
tokenizer holds it: a special token where there is one, its text where there is
not. It knows the tokenizer and a render function, nothing of the model.
"""

from __future__ import annotations

from typing import Callable

from engine.config.prompt import OUTPUT_FAMILIES

THINKING = "-thinking"
_PROBE = [{"role": "user", "content": "hi"}]
# The markers a grammar matches: tool calls (qwen) and the end of reasoning (-thinking).
MARKERS = ("<tool_call>", "</tool_call>", "<think>", "</think>")


def family_of(template: str, vocab) -> str:
    """The family whose markup the template shows (each family's marks, in _SHOWN's
    order), else whose markup the vocabulary holds as tokens (_HELD), else `plain`."""
    for family, marks in _SHOWN:
        if all(m in template for m in marks):
            return family
    for family, token in _HELD:
        if token in vocab:
            return family
    return "qwen" if "<think>" in vocab or "<think>" in template else "plain"


# family -> the markup its template shows, every piece of it (checked in this order: the
# first that matches decides).
_SHOWN = (
    ("kimi", ("<|tool_calls_section_begin|>",)),
    ("deepseek", ("<｜tool▁calls▁begin｜>",)),
    ("dsml", ("｜DSML｜",)),
    ("glm", ("<arg_key>",)),
    ("harmony", ("<|channel|>", "<|start|>assistant to=")),
    ("gemma4", ("<|tool_call>", "<tool_call|>")),
    ("minimax", ("<minimax:tool_call>",)),
    ("nemotron", ("<TOOLCALL>",)),
    ("command_r7b", ("<|START_ACTION|>",)),
    ("command_r", ("<|START_OF_TURN_TOKEN|>", "Action:")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("phi4", ("functools[",)),
    ("granite", ("<|tool_call|>",)),
    ("apertus", ("<|tools_prefix|>",)),
    ("apriel", ("[BEGIN FINAL RESPONSE]", "<tool_calls>")),  # before qwen: <tool_call>
    ("seed_oss", ("<seed:tool_call>",)),  # before qwen_xml: <function=, <parameter=
    ("gigachat3_1", ("<|role_sep|>", "<|function_call|>")),
    ("gigachat3", ("<|role_sep|>", "function call")),
    ("lfm2", ("<|tool_call_start|>",)),
    ("solar_open", ("<|tool_call:begin|>",)),
    ("qwen_xml", ("<function=", "<parameter=")),
    ("qwen", ("<tool_call>",)),
    ("pythonic", ("<|python_start|>",)),
    ("llama3_json", ("<|python_tag|>",)),
    ("llama3_json", ("<|start_header_id|>", '"parameters": ')),  # Llama 3.2: no python_tag
)
# family -> a token of its markup in the vocabulary (a template that shows none of it).
_HELD = (
    ("kimi", "<|tool_calls_section_begin|>"),
    ("apertus", "<|tools_prefix|>"),
    ("seed_oss", "<seed:tool_call>"),
    ("gigachat3_1", "<|function_call|>"),
    ("lfm2", "<|tool_call_start|>"),
    ("solar_open", "<|tool_call:begin|>"),
    ("deepseek", "<｜tool▁calls▁begin｜>"),
    ("glm", "<arg_key>"),
    ("qwen", "<tool_call>"),
    ("pythonic", "<|python_start|>"),
    ("llama3_json", "<|python_tag|>"),
)


# family -> what opens its reasoning, where that is not `<think>`
_REASONING = {
    "apertus": "<|inner_prefix|>",
    "apriel": "Here are my reasoning steps:",  # Apriel 1.6's generation prompt ends so
    "seed_oss": "<seed:think>",
    "solar_open": "<|think|>",
}


def opens_reasoning(render: Callable[[list], "str | None"], opener: str = "<think>") -> bool:
    """Whether the generation prompt ends inside an open reasoning block (`opener`; None:
    the template refused the probe, so it opens nothing we can see)."""
    text = render(list(_PROBE))
    return text is not None and text.rstrip().endswith(opener)


def special_markers(tokenizer) -> frozenset[str]:
    """The MARKERS the tokenizer holds as added tokens (each one token id, which a grammar
    names as `<marker>`); the others are text."""
    added = getattr(tokenizer, "get_added_vocab", dict)()
    return frozenset(m for m in MARKERS if m in added)


def output_format(setting: str, tokenizer, render: Callable[[list], str]) -> str:
    """The format the front end announces: `setting` unless auto, else detected.

    `render(messages)`: the chat template on messages, with the generation prompt, or
    None where the template refuses them.
    """
    if setting != "auto":
        return setting
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one speaks
        template = template.get("default") or next(iter(template.values()), "")
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    family = family_of(str(template or ""), vocab)
    assert family in OUTPUT_FAMILIES, family
    if family != "plain" and opens_reasoning(render, _REASONING.get(family, "<think>")):
        return family + THINKING
    return family
