"""A tool call streamed: however the output is split, each call's deltas join to the
arguments text its family's reader gives for the whole call; where the family has a
streamer, the arguments start before the call's closing marker; a streamed call whose
markup then breaks ends with what it streamed and leaks no markup.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

from clients.bridge import body_streams as lists
from clients.bridge.call_streams import STREAMERS
from clients.bridge.parsers import (
    MARKUPS,
    THINKING,
    OutputParser,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    joined,
    make_parser,
)
from tests.clients.bridge import test_call_formats, test_parsers
from tests.clients.bridge.test_parsers import _parse, _splits

# every case with a call its reader parses (a streamed call that breaks: BROKEN below)
CASES = [(c[0], c[1], c[2]) for c in test_parsers.CASES if c[5] and "garbage" not in c[0]]
CASES += [(c[0], c[1], c[2]) for c in test_call_formats.CASES if c[5]]


def _whole(family: str, output: str) -> list[str]:
    """The arguments text of each call as the family's reader gives it, nothing streamed."""
    name = family.removesuffix(THINKING)
    p = OutputParser(replace(MARKUPS[name], stream=None), reasoning=family.endswith(THINKING))
    parts = p.feed(output) + p.close()
    return [_arguments(parts, s.index) for s in parts if isinstance(s, ToolCallStart)]


def _arguments(parts, index: int) -> str:
    return "".join(
        p.arguments_text for p in parts if isinstance(p, ToolCallDelta) and p.index == index
    )


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_split_streams_the_readers_arguments_text(case):
    _, family, output = case
    expected = _whole(family, output)
    assert expected and all(json.loads(a) is not None for a in expected)
    for pieces in _splits(output):
        parts = _parse(family, pieces)
        starts = [p for p in parts if isinstance(p, ToolCallStart)]
        assert [_arguments(parts, s.index) for s in starts] == expected, pieces
        for s in starts:  # no delta before its start, none after its end
            at = parts.index(s)
            end = next(
                k for k, p in enumerate(parts) if isinstance(p, ToolCallEnd) and p.index == s.index
            )
            around = parts[:at] + parts[end:]
            assert not any(isinstance(p, ToolCallDelta) and p.index == s.index for p in around)


# (family, output, the closing marker): a call with arguments in each family with a streamer
EARLY = [
    ("qwen", '<tool_call>\n{"name": "f", "arguments": {"city": "Rome"}}\n</tool_call>'),
    ("kimi", '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"city": "Rome"}'),
    ("deepseek", '<｜tool▁call▁begin｜>f<｜tool▁sep｜>{"city": "Rome"}<｜tool▁call▁end｜>'),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"city": "Rome"}'),
    ("harmony", 'to=functions.f <|constrain|>json<|message|>{"city": "Rome"}<|call|>'),
    ("qwen_xml", "<tool_call>\n<function=f>\n<parameter=city>\nRome\n</parameter>\n</function>"),
    ("glm", "<tool_call>f<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>"),
    (
        "minimax",
        '<minimax:tool_call><invoke name="f"><parameter name="city">Rome</parameter></invoke>'
        "</minimax:tool_call>",
    ),
    (
        "dsml",
        '<｜DSML｜invoke name="f"><｜DSML｜parameter name="city" string="true">Rome'
        "</｜DSML｜parameter></｜DSML｜invoke>",
    ),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"city": "Rome"}, "id": "a1b2c3d4e"}]'),
    ("nemotron", '<TOOLCALL>[{"name": "f", "arguments": {"city": "Rome"}}]</TOOLCALL>'),
    ("granite", '<|tool_call|>[{"name": "f", "arguments": {"city": "Rome"}}]'),
    ("phi4", 'functools[{"name": "f", "arguments": {"city": "Rome"}}]'),
    ("command_r", 'Action: ```json\n[{"tool_name": "f", "parameters": {"city": "Rome"}}]\n```'),
    (
        "command_r7b",
        '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": '
        '{"city": "Rome"}}]<|END_ACTION|>',
    ),
    ("llama3_json", '{"name": "f", "parameters": {"city": "Rome"}}'),  # no marker: a tool's name
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"city": "Rome"}}'),
    ("pythonic", '[f(city="Rome")]'),
    ("pythonic", '<|python_start|>[f(city="Rome")]<|python_end|>'),
    ("gemma4", '<|tool_call>call:f{city:<|"|>Rome<|"|>}<tool_call|>'),
    ("lfm2", '<|tool_call_start|>[f(city="Rome")]<|tool_call_end|>'),
]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

JSON_TEXT = ("qwen", "kimi", "deepseek", "mistral", "harmony", "llama3_json")
JSON_TEXT += ("nemotron", "granite", "phi4", "command_r", "command_r7b")


def test_every_family_with_a_streamer_is_tried():
    assert {family for family, _ in EARLY} == set(STREAMERS) | set(lists.STREAMERS)


@pytest.mark.parametrize("family, output", EARLY, ids=[f"{c[0]} {c[1][:14]}" for c in EARLY])
def test_the_arguments_stream_before_the_call_ends(family, output):
    """Fed a character at a time: the name and `"city"` go out before the call's end."""
    p, seen = make_parser(family, tools=TOOLS), []
    for i, ch in enumerate(output):
        seen += [(i, part) for part in p.feed(ch)]
    seen += [(len(output), part) for part in p.close()]
    start = next(i for i, part in seen if isinstance(part, ToolCallStart))
    city = next(
        i
        for i, part in seen
        if isinstance(part, ToolCallDelta)
        and '"city"' in _arguments([x for _, x in seen if _ <= i], 0)
    )
    # JSON text streams as written; a parameter once its closing tag has come
    settled = output.index("Rome") if family in JSON_TEXT else len(output) - 1
    assert start < city < settled, seen
    parts = [part for _, part in seen]
    assert json.loads(_arguments(parts, 0)) == {"city": "Rome"}
    assert len([x for x in parts if isinstance(x, ToolCallDelta)]) > 1


def test_a_call_without_a_marker_streams_only_once_it_names_a_tool():
    """Llama 3's JSON at the output's start may be text: naming no tool of the request, it
    streams nothing and comes whole at the end (a call all the same where it parses)."""
    output = '{"name": "g", "parameters": {"city": "Rome"}}'
    p = make_parser("llama3_json", tools=TOOLS)
    fed = [part for ch in output for part in p.feed(ch)]
    assert fed == []
    _, _, calls = joined(fed + p.close())
    assert [(s.name, e.arguments) for s, e in calls] == [("g", {"city": "Rome"})]


BROKEN = [
    # JSON text: streamed as written, so the call's arguments are that text (no object)
    ("qwen", 'Sure.<tool_call>\n{"name": "f", "arguments": {"a": 1, oops}}\n</tool_call>', None),
    # parameters: the ones streamed, closed
    (
        "minimax",
        'Sure.<minimax:tool_call><invoke name="f"><parameter name="a">1</parameter>junk'
        "</invoke></minimax:tool_call>",
        {"a": 1},
    ),
]


@pytest.mark.parametrize("family, output, arguments", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_streamed_call_that_breaks_ends_with_what_it_streamed(family, output, arguments, caplog):
    from clients.bridge.chat_completions import ChatShape
    from clients.wire import Final, Restore, Timing, Usage

    with caplog.at_level(logging.WARNING):
        for pieces in _splits(output):
            parts = _parse(family, pieces)
            text, _, calls = joined(parts)
            assert text == "Sure." and [(s.name, e.arguments) for s, e in calls] == [
                ("f", arguments)
            ]
        shape = ChatShape("r1", {"id": "tiny", "fingerprint": "fp"}, make_parser(family))
        chunks = [c for ch in output for c in shape.delta(ch)]
        chunks += shape.finish(Final("stop", Usage(1, 0, 1), Restore(), Timing(), "r1"))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Sure."
    streamed = "".join(t["function"]["arguments"] for d in deltas for t in d.get("tool_calls", ()))
    assert streamed == _arguments(_parse(family, [output]), 0)
    assert any("streamed tool call" in r.getMessage() for r in caplog.records)


def test_a_streamed_call_that_max_tokens_cut_is_a_call_and_the_reply_says_length():
    from clients.bridge.chat_completions import ChatShape
    from clients.wire import Final, Restore, Timing, Usage

    output = 'Sure.<tool_call>\n{"name": "f", "arguments": {"city": "Ro'
    shape = ChatShape("r1", {"id": "tiny", "fingerprint": "fp"}, make_parser("qwen"))
    chunks = [c for ch in output for c in shape.delta(ch)]
    chunks += shape.finish(Final("length", Usage(1, 0, 1), Restore(), Timing(), "r1"))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [t for d in deltas for t in d.get("tool_calls", ())]
    assert "".join(d.get("content") or "" for d in deltas) == "Sure."
    assert calls[0]["function"]["name"] == "f"
    assert "".join(t["function"]["arguments"] for t in calls) == '{"city": "Ro'
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "family, output",
    [
        ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>}'),
        ("pythonic", "<|python_start|>[get_weather(city='Rome')"),
        ("lfm2", "<|tool_call_start|>[get_weather(city='Rome')"),
    ],
)
def test_a_call_whose_arguments_closed_streams_its_closing_brace_before_it_ends(family, output):
    """The arguments' `}` goes out once the call's own bracket closes them, before the
    closing marker (or a next call) ends the call: a client sees a whole object."""
    p = make_parser(family, tools=TOOLS)
    parts = p.feed(output)
    assert not any(isinstance(x, ToolCallEnd) for x in parts), parts
    assert _arguments(parts, 0) == '{"city": "Rome"}'
    open_call = make_parser(family, tools=TOOLS).feed(output.rstrip(")}"))
    assert _arguments(open_call, 0) == "{"  # not closed yet: its value is not settled either
