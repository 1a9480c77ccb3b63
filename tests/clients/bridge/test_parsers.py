"""The output parsers: reasoning and tool calls per model family, whole and streamed.

Every case is fed whole, then split in two at every position, then one character
at a time: each way must give the same text, reasoning and calls, and no markup
may reach the text (the case's expected text says exactly what text there is).
"""

from __future__ import annotations

import json

import pytest

from clients.bridge.parsers import (
    ReasoningPart,
    TextPart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    joined,
    make_parser,
)

QWEN_CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "setup.py"}}\n</tool_call>'
DEEPSEEK_CALLS = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>read_file<｜tool▁sep｜>"
    '{"path": "a.py"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>run<｜tool▁sep｜>{}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
DSML_CALL = (
    '<｜DSML｜function_calls>\n<｜DSML｜invoke name="read_file">\n'
    '<｜DSML｜parameter name="path" string="true">20</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="limit" string="false">20</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>"
)
XML_CALL = (
    "<tool_call>\n<function=read_file>\n<parameter=path>\na.py\n</parameter>\n"
    "<parameter=limit>\n20\n</parameter>\n</function>\n</tool_call>"
)
GLM_CALL = (
    "<tool_call>run_tests\n<arg_key>pattern</arg_key>\n<arg_value>test_*.py</arg_value>\n"
    "<arg_key>verbose</arg_key>\n<arg_value>true</arg_value>\n</tool_call>"
)
KIMI_CALLS = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0"
    '<|tool_call_argument_begin|>{"path": "a.py"}<|tool_call_end|>'
    "<|tool_call_begin|>functions.read_file:1<|tool_call_argument_begin|>"
    '{"path": "b.py"}<|tool_call_end|><|tool_calls_section_end|>'
)
READ = ("read_file", {"path": "setup.py"})

# (id, family, output, text, reasoning, [(name, arguments)], malformed raw texts)
CASES = [
    ("plain text", "qwen", "hello <there> < think", "hello <there> < think", "", [], []),
    ("text keeps its whitespace", "qwen", "\n  two\n\nlines \n", "\n  two\n\nlines \n", "", [], []),
    ("reasoning", "qwen", "<think>\nweigh it\n</think>\n\nAnswer.", "Answer.", "weigh it", [], []),
    ("call", "qwen", QWEN_CALL, "", "", [READ], []),
    (
        "reasoning, text, two calls",
        "qwen",
        "<think>Need a file.</think>\n\nLet me look.\n"
        + QWEN_CALL
        + "\n"
        + QWEN_CALL.replace("setup", "tox"),
        "Let me look.",
        "Need a file.",
        [READ, ("read_file", {"path": "tox.py"})],
        [],
    ),
    (
        "string arguments",
        "qwen",
        '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>',
        "",
        "",
        [("f", {"a": 1})],
        [],
    ),
    ("unterminated but whole", "qwen", QWEN_CALL[: -len("</tool_call>")], "", "", [READ], []),
    (
        "bad json is text",
        "qwen",
        "Try: <tool_call>\n{nope}\n</tool_call> done",
        "Try: <tool_call>\n{nope}\n</tool_call> done",  # as written
        "",
        [],
        [" <tool_call>\n{nope}\n</tool_call>"],  # with the whitespace before it
    ),
    # the output's end (max_tokens, a stop string) cut the call: its markup is dropped
    ("cut off", "qwen", "Look.\n" + QWEN_CALL[:30], "Look.", "", [], [""]),
    (
        "nameless",
        "qwen",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        "",
        [],
        ['<tool_call>{"arguments": {}}</tool_call>'],
    ),
    ("a stray closer is dropped", "qwen", "a</think>b", "ab", "", [], []),
    ("partial marker at the end is text", "qwen", "x <tool_c", "x <tool_c", "", [], []),
    (
        "thinking template",
        "qwen-thinking",
        "<think>\nhm\n</think>\n\nyes",
        "yes",
        "hm",
        [],
        [],
    ),
    (
        "thinking template, no opener",
        "qwen-thinking",
        "hm, so\n</think>\nyes",
        "yes",
        "hm, so",
        [],
        [],
    ),
    (
        "glm",
        "glm",
        "<think>check</think>Running.\n" + GLM_CALL,
        "Running.",
        "check",
        [("run_tests", {"pattern": "test_*.py", "verbose": True})],
        [],
    ),
    (
        "qwen_xml",
        "qwen_xml",
        "<think>look</think>Reading.\n" + XML_CALL,
        "Reading.",
        "look",
        [("read_file", {"path": "a.py", "limit": 20})],
        [],
    ),
    (
        "deepseek",
        "deepseek",
        "<think>two</think>Reading." + DEEPSEEK_CALLS,
        "Reading.",
        "two",
        [("read_file", {"path": "a.py"}), ("run", {})],
        [],
    ),
    (
        "dsml",
        "dsml",
        "Reading.\n" + DSML_CALL,
        "Reading.",
        "",
        [("read_file", {"path": "20", "limit": 20})],
        [],
    ),
    (  # the call streamed once its name came: it ends with what it streamed, no markup
        "qwen_xml garbage",
        "qwen_xml",
        "<tool_call>\n<function=f>\nstray</function>\n</tool_call>",
        "",
        "",
        [("f", {})],
        [],
    ),
    (
        "glm without arguments",
        "glm",
        "<tool_call>list_files</tool_call>",
        "",
        "",
        [("list_files", {})],
        [],
    ),
    (
        "glm garbage",
        "glm",
        "<tool_call>a b <c></tool_call>",
        "<tool_call>a b <c></tool_call>",
        "",
        [],
        ["<tool_call>a b <c></tool_call>"],
    ),
    (
        "kimi",
        "kimi",
        "<think>two files</think>Reading both." + KIMI_CALLS,
        "Reading both.",
        "two files",
        [("read_file", {"path": "a.py"}), ("read_file", {"path": "b.py"})],
        [],
    ),
    (
        "plain family parses nothing",
        "plain",
        "<think>x</think>" + QWEN_CALL,
        "<think>x</think>" + QWEN_CALL,
        "",
        [],
        [],
    ),
]


def _splits(text: str):
    """The text whole, in two at every position, and one character at a time."""
    yield [text]
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    yield list(text)


def _parse(family: str, pieces) -> list:
    p = make_parser(family)
    parts = [part for piece in pieces for part in p.feed(piece)]
    return parts + p.close()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_split_gives_the_same_parts(case):
    _, family, output, text, reasoning, calls, malformed = case
    for pieces in _splits(output):
        parts = _parse(family, pieces)
        got_text, got_reasoning, got_calls = joined(parts)
        assert (got_text, got_reasoning) == (text, reasoning), pieces
        assert [(s.name, e.arguments) for s, e in got_calls] == calls, pieces
        assert [p.raw for p in parts if isinstance(p, ToolCallEnd) and p.arguments is None] == (
            malformed
        )
        # The streamed pieces carry no markup beyond what the case says is text.
        streamed = "".join(p.text for p in parts if isinstance(p, (TextPart, ReasoningPart)))
        for marker in ("<think>", "</think>", "<|tool_call_begin|>", "<arg_key>"):
            assert streamed.count(marker) <= (text + "".join(malformed)).count(marker)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_call_comes_as_start_deltas_end_with_dense_indexes(case):
    family, output, calls = case[1], case[2], case[5]
    parts = _parse(family, list(output))
    starts = [p for p in parts if isinstance(p, ToolCallStart)]
    assert [s.index for s in starts] == list(range(len(calls)))
    for s in starts:  # each call: its start, then only its deltas, then its end
        i = parts.index(s)
        ends = [k for k, p in enumerate(parts) if isinstance(p, ToolCallEnd)]
        j = next(k for k in ends if parts[k].index == s.index)
        assert i < j and all(
            isinstance(p, ToolCallDelta) and p.index == s.index for p in parts[i + 1 : j]
        )
    arguments = [arguments_text(parts, s.index) for s in starts]
    assert [json.loads(a) for a in arguments] == [a for _, a in calls]
    assert len({s.call_id for s in starts}) == len(starts)


def arguments_text(parts, index: int) -> str:
    deltas = [p for p in parts if isinstance(p, ToolCallDelta) and p.index == index]
    return "".join(p.arguments_text for p in deltas)


def test_the_arguments_text_is_the_models_own():
    """Sent back, it renders the same tokens (the reply stays in the cache)."""
    compact = '<tool_call>\n{"name": "f", "arguments": {"a":1,"b":[2, 3]}}\n</tool_call>'
    (delta,) = [p for p in _parse("qwen", [compact]) if isinstance(p, ToolCallDelta)]
    assert delta.arguments_text == '{"a":1,"b":[2, 3]}'
    (start,) = [p for p in _parse("kimi", [KIMI_CALLS]) if isinstance(p, ToolCallStart)][:1]
    assert start.call_id == "functions.read_file:0"


def test_without_tools_call_markup_stays_text_but_reasoning_is_parsed():
    p = make_parser("qwen", tool_calls=False)
    text, reasoning, calls = joined(p.feed("<think>r</think>" + QWEN_CALL) + p.close())
    assert (text, reasoning, calls) == (QWEN_CALL, "r", [])


def test_glm_keeps_declared_strings():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string"}, "n": {"type": "integer"}},
                },
            },
        }
    ]
    pair = "<arg_key>{}</arg_key><arg_value>42</arg_value>"
    out = "<tool_call>f" + pair.format("code") + pair.format("n") + "</tool_call>"
    p = make_parser("glm", tools=tools)
    _, _, calls = joined(p.feed(out) + p.close())
    assert calls[0][1].arguments == {"code": "42", "n": 42}


def test_an_unknown_family_is_refused_by_name():
    with pytest.raises(ValueError, match="'llama'"):
        make_parser("llama")
