"""Each output family's tool-call markup, as a table the tool grammars are built from.

A family (the output-format string without `-thinking`) writes its calls in one
of a few shapes (`Markup.shape`):

- `calls`: each call carries its own opener and closer (`<tool_call>…</tool_call>`),
  calls follow one another with `sep` between;
- `section`: the calls sit inside one section (`section_open` … `section_close`),
  `sep` between them;
- `array`: the calls are one JSON array after `opener` (and before `closer`);
- `harmony`, `pythonic`, `mistral`, `llama3_json`: a shape of their own
  (engine.runtime.structured.tools builds each); `pylist`, `gigachat`, `solar`
  likewise (engine.runtime.structured.tagged);
- `tags`: calls written as tags, each family its own (`args` names it;
  engine.runtime.structured.tag_tools builds them).

The arguments of one call (`Markup.args`) are a JSON object (`json`), or
parameters in the family's own markup: `qwen_xml`, `minimax`, `dsml`, `glm`
(XML-ish, a parameter per declared property, string values as free text up to
the closing tag), `seed` (Seed-OSS, the same with no newlines around the value),
`gemma` (`k:<|"|>v<|"|>`), `python` (`k="v"`). An `array` family's items are
`{name-key: NAME, arguments-key: {…}}` by `keys`, or `{NAME: {…}}` (`KEYED`).

`opener` is what the lazy `auto` grammar waits for (free text until it), `think_close`
where a `-thinking` format's reasoning ends, `think_open` a reasoning block the model
opens itself (Gemma's thought channel, Command R7B's plan, Magistral's `[THINK]`),
allowed before the calls. Each text here is what the family's
published chat template writes for a past call (and its documents say the model
writes); where templates of one family differ in whitespace, the grammar allows either.

`markers_of` lists a family's markers; `token_markers(tokenizer)` says which of all
families' markers a tokenizer holds as added tokens (text -> id): those are matched
as that one token, the others as text.

Plain data and one lookup of the tokenizer's added vocabulary: no llguidance, no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_CLOSE = "</think>"


KEYED = ("", "")  # keys of a call written `{NAME: {arguments}}` (Apertus)


@dataclass(frozen=True)
class Markup:
    shape: str  # calls | section | array | harmony | pythonic | mistral | llama3_json
    opener: str  # the lazy grammar's trigger: a call (or the calls' section) starts here
    args: str = "json"  # json | qwen_xml | minimax | dsml | glm | gemma | python
    closer: str = ""  # the end of one call (`calls`) or of the array (`array`)
    sep: str = ""  # between two calls
    section_open: str = ""
    section_close: str = ""
    keys: tuple[str, str] = ("name", "arguments")  # a JSON call's name and arguments keys
    think_close: str = THINK_CLOSE
    think_open: str = ""  # a reasoning block the model opens itself (optional, at the start)
    think_name: str = ""  # the text after think_open that names the block (Gemma's channel)
    words: tuple[str, ...] = ()  # further markers, for token_markers


FAMILIES: dict[str, Markup] = {
    "qwen": Markup("calls", "<tool_call>", closer="</tool_call>", sep="\n"),
    "qwen_xml": Markup("calls", "<tool_call>", "qwen_xml", "</tool_call>", "\n"),
    "glm": Markup(
        "calls",
        "<tool_call>",
        "glm",
        "</tool_call>",
        words=("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    ),
    "kimi": Markup(
        "section",
        "<|tool_calls_section_begin|>",
        section_open="<|tool_calls_section_begin|>",
        section_close="<|tool_calls_section_end|>",
        words=("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
    ),
    "deepseek": Markup(
        "section",
        "<｜tool▁calls▁begin｜>",
        section_open="<｜tool▁calls▁begin｜>",
        section_close="<｜tool▁calls▁end｜>",
        words=("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"),
    ),
    "dsml": Markup(
        "section",
        "<｜DSML｜function_calls>",
        "dsml",
        section_open="<｜DSML｜function_calls>",
        section_close="</｜DSML｜function_calls>",
    ),
    "minimax": Markup(
        "section",
        "<minimax:tool_call>",
        "minimax",
        section_open="<minimax:tool_call>",
        section_close="</minimax:tool_call>",
    ),
    "llama3_json": Markup("llama3_json", "<|python_tag|>", keys=("name", "parameters")),
    "pythonic": Markup("pythonic", "[", "python"),
    "mistral": Markup(
        "mistral", "[TOOL_CALLS]", think_close="[/THINK]", think_open="[THINK]", words=("[ARGS]",)
    ),
    "harmony": Markup(
        "harmony",
        "<|channel|>",
        think_close="<|end|>",
        words=("<|message|>", "<|constrain|>", "<|call|>", "<|start|>", "<|end|>"),
    ),
    "gemma4": Markup(
        "calls",
        "<|tool_call>",
        "gemma",
        "<tool_call|>",
        think_close="<channel|>",
        think_open="<|channel>",
        think_name="thought",  # the one channel a model writes: `<|channel>code` is no reasoning
        words=('<|"|>',),
    ),
    "command_r": Markup("array", "Action:", keys=("tool_name", "parameters")),
    "command_r7b": Markup(
        "array",
        "<|START_ACTION|>",
        closer="<|END_ACTION|>",
        keys=("tool_name", "parameters"),
        think_close="<|END_THINKING|>",
        think_open="<|START_THINKING|>",
    ),
    "nemotron": Markup("array", "<TOOLCALL>", closer="</TOOLCALL>"),
    "granite": Markup("array", "<|tool_call|>"),
    "phi4": Markup("array", "functools"),
    # the families of engine.runtime.structured.tagged
    "apertus": Markup(
        "array",
        "<|tools_prefix|>",
        closer="<|tools_suffix|>",
        keys=KEYED,
        think_close="<|inner_suffix|>",
        think_open="<|inner_prefix|>",
    ),
    "apriel": Markup(
        "array",
        "<tool_calls>",
        closer="</tool_calls>",
        think_close="[BEGIN FINAL RESPONSE]",
        think_open="Here are my reasoning steps:",
    ),
    "seed_oss": Markup(
        "calls",
        "<seed:tool_call>",
        "seed",
        "</seed:tool_call>",
        "\n",
        think_close="</seed:think>",
        think_open="<seed:think>",
    ),
    "gigachat3": Markup("gigachat", "<|message_sep|>", words=("<|role_sep|>",)),
    "gigachat3_1": Markup("gigachat", "<|function_call|>", closer="<|message_sep|>"),
    "lfm2": Markup(
        "pylist", "<|tool_call_start|>", "python", "<|tool_call_end|>", think_open="<think>"
    ),
    "solar_open": Markup(
        "solar",
        "<|tool_calls|>",
        think_close="<|end|>",
        words=(
            "<|think|>",
            "<|begin|>",
            "<|content|>",
            "<|calls|>",
            "<|tool_call:begin|>",
            "<|tool_call:name|>",
            "<|tool_call:args|>",
            "<|tool_call:end|>",
        ),
    ),
    # calls written as tags: `args` names the family (engine.runtime.structured.tag_tools)
    "kimi_k3": Markup(
        "tags",
        "<|open|>tools<|sep|>",
        "kimi_k3",
        think_close="<|close|>think<|sep|>",
        words=("<|open|>", "<|sep|>", "<|close|>"),
    ),
    "minimax_m1": Markup("tags", "<tool_calls>", "minimax_m1", "</tool_calls>"),
    "minimax_m3": Markup(
        "tags",
        "]<]minimax[>[<tool_call>",
        "minimax_m3",
        "]<]minimax[>[</tool_call>",
        think_close="</mm:think>",
        words=("]<]minimax[>[", "<mm:think>"),
    ),
    "atem": Markup(
        "tags",
        " to=",
        "atem",
        think_close="<|eom|>",
        words=("<|start|>", "<|message|>", "<|eom|>", "<|eot|>"),
    ),
    "minicpm": Markup("tags", '<function name="', "minicpm", "</function>", "\n"),
    "hy3": Markup(
        "tags",
        "<tool_calls:opensource>",
        "hy3",
        "</tool_calls:opensource>",
        think_close="</think:opensource>",
        words=(
            "<think:opensource>",
            "<tool_call:opensource>",
            "</tool_call:opensource>",
            "<tool_sep:opensource>",
            "<arg_key:opensource>",
            "</arg_key:opensource>",
            "<arg_value:opensource>",
            "</arg_value:opensource>",
        ),
    ),
    "functionary_v3_1": Markup("tags", "<function=", "functionary_v3_1", "</function>"),
    "functionary_v3_2": Markup("tags", ">>>", "functionary_v3_2"),
}
# Families whose format has no call markup to hold: `required` and a named tool are refused.
UNCONSTRAINED = ("plain",)


def markers_of(markup: Markup) -> tuple[str, ...]:
    """Every marker a family's grammar may name as a token."""
    texts = (
        markup.opener,
        markup.closer,
        markup.section_open,
        markup.section_close,
        markup.think_close,
        markup.think_open,
        *markup.words,
    )
    return tuple(t for t in texts if t)


ALL_MARKERS = frozenset({m for f in FAMILIES.values() for m in markers_of(f)} | {"<think>"})


def token_markers(tokenizer) -> dict[str, int]:
    """The markers (of every family) the tokenizer holds as added tokens: text -> id."""
    added = getattr(tokenizer, "get_added_vocab", dict)()
    return {m: int(added[m]) for m in sorted(ALL_MARKERS) if m in added}
