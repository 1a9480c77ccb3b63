"""The prompt builder's agent-facing parts on the embedded tokenizer and template:
volatile lines, message layouts (and the miss kinds they give), the output format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.cache.kinds import MissKind
from engine.cache.misses import MissLog
from engine.config import PromptConfig
from engine.server.prompts.layout import Layouts
from engine.server.prompts.output_format import family_of, output_format
from engine.server.prompts.prompt import PromptBuilder, PromptInput
from engine.server.prompts.volatile import VolatileLines

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "engine" / "runtime" / "model" / "assets" / "tokenizer"


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(ASSETS)


@pytest.fixture
def builder(tokenizer):
    return PromptBuilder(tokenizer, 1 << 20, 1 << 20)


def billing(cch: str, version: str = "2.1.117.48f") -> str:
    return f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli; cch={cch};"


CLAUDE_SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude.\nBe concise."
TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "Read",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}},
        },
    },
)


def claude_code(cch: str, *turns: str) -> PromptInput:
    """A Claude-Code-shaped request: the billing header block, then the system prompt."""
    messages = [
        {"role": "system", "content": billing(cch)},
        {"role": "system", "content": CLAUDE_SYSTEM},
    ]
    messages += [{"role": "user", "content": t} for t in turns]
    return PromptInput(messages=tuple(messages), tools=TOOLS)


def test_two_requests_differing_only_in_the_billing_line_are_the_same_prompt(builder):
    a = builder.build(claude_code("71fea", "hi"))
    b = builder.build(claude_code("0aaa9", "hi"))
    assert a.tokens == b.tokens and a.volatile == b.volatile == 1
    bare = PromptBuilder(
        builder.tokenizer, 1 << 20, 1 << 20, prompt=PromptConfig(volatile_lines=())
    )
    x, y = bare.build(claude_code("71fea", "hi")), bare.build(claude_code("0aaa9", "hi"))
    assert x.tokens != y.tokens and x.volatile == 0  # without the rule they differ


@pytest.mark.parametrize(
    "rules, text, kept, removed",
    [
        (("^x-anthropic-billing-header:",), billing("1") + "\nStay.", "Stay.", 1),
        (("^x-anthropic-billing-header:",), "Stay.\n" + billing("1") + "\n", "Stay.\n", 1),
        (("^x-anthropic-billing-header:",), "Mention x-anthropic-billing-header: here", None, 0),
        ((r"^Today is \d{4}-\d\d-\d\d$", "^cch="), "A\nToday is 2025-01-31\r\ncch=9\nB", "A\nB", 2),
    ],
)
def test_a_volatile_line_goes_with_its_line_break(rules, text, kept, removed):
    messages = ({"role": "system", "content": text}, {"role": "user", "content": text})
    out, n = VolatileLines(rules).apply(messages)
    assert n == removed
    assert out[0]["content"] == (text if kept is None else kept)
    assert out[1] is messages[1]  # only system messages are read


def test_message_starts_fall_on_the_template_boundaries(builder):
    tok = builder.tokenizer
    messages = (
        {"role": "system", "content": "You are careful."},
        {"role": "user", "content": "Read setup.py"},
        {"role": "assistant", "content": "Reading it."},
        {"role": "user", "content": "Now the tests, naïvely ✓"},
    )
    p = builder.build(PromptInput(messages=messages, tools=TOOLS))
    starts = p.layout.starts
    assert len(starts) == 4 and list(starts) == sorted(starts)
    # Tools first: message 0 (the system text) starts after them and their separator.
    assert tok.decode(list(p.tokens[: starts[0]])).endswith("</tool_call>\n\n")
    assert tok.decode(list(p.tokens[starts[0] : starts[1]])).strip().startswith("You are careful")
    for k in (1, 2, 3):
        assert tok.decode(list(p.tokens[starts[k] : starts[k] + 1])) == "<|im_start|>"
    assert p.layout.roles == ("system", "user", "assistant", "user") and p.layout.tools
    again = builder.build(PromptInput(messages=messages, tools=TOOLS))
    assert again.layout == p.layout and builder.layouts.renders == 4  # memoized


def _miss(builder, earlier, reply: str, new, tools=TOOLS):
    """The Miss of `new` after `earlier` ran and generated `reply` (its tokens stored)."""
    log = MissLog()
    first = builder.build(PromptInput(messages=tuple(earlier), tools=tools))
    stored = np.asarray(
        first.tokens + tuple(builder.tokenizer.encode(reply, add_special_tokens=False)), np.int32
    )
    log.record("", stored, first.layout)
    second = builder.build(PromptInput(messages=tuple(new[0]), tools=new[1]))
    tokens = np.asarray(second.tokens, np.int32)
    # Restored nothing, though the cache still holds the earlier prompt and its reply.
    return log.explain("", tokens, second.layout, 0, lambda: len(stored))


SYSTEM = {"role": "system", "content": "You are a careful coding agent.\nWork in small steps."}
ASK = {"role": "user", "content": "Read setup.py and summarize it."}
REPLY = "It installs the package."
NEXT = {"role": "user", "content": "And the tests?"}


@pytest.mark.parametrize(
    "name, new, kind, message",
    [
        (
            "system",
            [{**SYSTEM, "content": "You are a careful coding agent.\nWork in big steps."}, ASK],
            MissKind.SYSTEM,
            0,
        ),
        ("tools", [SYSTEM, ASK], MissKind.TOOLS, 0),  # no tools now: message 0 comes first
        (
            "history",
            [
                SYSTEM,
                ASK,
                {"role": "assistant", "content": REPLY},
                NEXT,
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "more"},
            ],
            None,
            None,
        ),
        (
            "reply re-rendered",
            [SYSTEM, ASK, {"role": "assistant", "content": "It installs it."}, NEXT],
            MissKind.TEMPLATE,
            2,
        ),
        ("continued", [SYSTEM, ASK, {"role": "assistant", "content": REPLY}, NEXT], None, None),
    ],
)
def test_real_prompts_give_the_miss_kind(builder, name, new, kind, message):
    tools = None if name == "tools" else TOOLS
    miss = _miss(builder, [SYSTEM, ASK], REPLY + "<|im_end|>", (new, tools))
    if kind is None:
        assert miss is None
    else:
        assert (miss.kind, miss.message) == (kind, message)


def test_an_edited_past_message_is_history(builder):
    turn2 = [SYSTEM, ASK, {"role": "assistant", "content": REPLY}, NEXT]
    edited = [SYSTEM, ASK, {"role": "assistant", "content": REPLY}, {**NEXT, "content": "And?"}]
    miss = _miss(
        builder, turn2, "Yes.<|im_end|>", (edited + [{"role": "user", "content": "x"}], TOOLS)
    )
    assert (miss.kind, miss.message) == (MissKind.HISTORY, 3)


def test_layouts_without_offsets_have_no_starts():
    layouts = Layouts(lambda messages, tools: "")
    layout = layouts.layout([{"role": "user", "content": "x"}], None, "x", None, [1])
    assert layout.starts == () and layout.roles == ("user",) and len(layout.digests) == 1


@pytest.mark.parametrize(
    "template, vocab, family",
    [
        ("{{ '<|tool_calls_section_begin|>' }}", {}, "kimi"),
        ("<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>", {}, "glm"),
        ("plain {{ messages }}", {"<arg_key>": 7}, "glm"),
        ("<tool_call>\n<function={{ n }}>\n<parameter={{ k }}>", {}, "qwen_xml"),
        ("<think>{{ '<｜tool▁calls▁begin｜>' }}", {}, "deepseek"),
        ("<think>{% set d = '｜DSML｜' %}", {}, "dsml"),
        ('<tool_call>\\n{"name": ...', {}, "qwen"),
        ("plain {{ messages }}", {"<think>": 5}, "qwen"),
        ("plain {{ messages }}", {}, "plain"),
    ],
)
def test_the_family_comes_from_the_template_and_vocabulary(template, vocab, family):
    assert family_of(template, vocab) == family


def test_the_output_format_is_detected_or_set(builder, tokenizer):
    assert builder.output_format == "qwen"  # the embedded template: <tool_call> JSON, <think>

    def opens(messages):
        return "<|im_start|>assistant\n<think>\n"

    assert output_format("auto", tokenizer, opens) == "qwen-thinking"
    assert output_format("glm", tokenizer, opens) == "glm"
    set_plain = PromptBuilder(tokenizer, 10, 10, prompt=PromptConfig(output_format="plain"))
    assert set_plain.output_format == "plain"


def test_bad_rules_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match=r"--volatile-line \(LINEAGE_VOLATILE_LINE\).*empty line"):
        PromptConfig(volatile_lines=(".*",))
    with pytest.raises(ValueError, match="not a regular expression"):
        PromptConfig(volatile_lines=("([",))


def test_edited_tools_are_before_message_0_in_the_embedded_template(builder):
    edited = ({**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "Read it"}},)
    miss = _miss(builder, [SYSTEM, ASK], REPLY + "<|im_end|>", ([SYSTEM, ASK], edited))
    assert (miss.kind, miss.message) == (MissKind.TOOLS, -1)
