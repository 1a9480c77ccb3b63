"""A model's output is untrusted text: every family's parser reads any output back,
whole and streamed, without raising, and what does not parse comes back as text.

Adversarial values (nesting past any parser's depth, integers past Python's
int-string limit, NaN and Infinity, lone surrogate escapes, Python that recurses in
the compiler, values JSON cannot hold) are put where each family's calls carry their
arguments, and random mixes of a family's markers with garbage are fed too, all from
seeded generators. Each output is fed whole and in random pieces. `LINEAGE_DEEP_TESTS=1`
runs more of the random mixes.
"""

from __future__ import annotations

import json
import random

import pytest

from clients.bridge.literals import MAX_JSON_DEPTH, json_depth, json_value, python_literal_text
from clients.bridge.parsers import (
    FAMILIES,
    MARKUPS,
    THINKING,
    ReasoningPart,
    TextPart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    make_parser,
)
from engine.server.security.limits import text_depth
from tests.deep import examples

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "object"}, "s": {"type": "string"}},
            },
        },
    }
]

# Values no parser may choke on, as a model could write them.
PAYLOADS = [
    "[" * 2000,
    "[" * 2000 + "]" * 2000,
    '{"a": ' * 2000 + "1" + "}" * 2000,
    "(" * 2000 + ")" * 2000,
    "{'a': " * 300 + "1" + "}" * 300,
    "-" * 5000 + "1",
    "not " * 5000 + "1",
    "a" + ".a" * 5000,
    "f" + "()" * 3000,
    "x" + "[0]" * 3000,
    "1" + "+1" * 5000,
    "lambda: " * 3000 + "1",
    "1" * 5000,
    "-" + "9" * 4400,
    "1e999",
    "1" * 400 + ".5",
    "NaN",
    "Infinity",
    "-Infinity",
    '"\\ud800"',
    '"\\udfff tail"',
    '{"k": "\\ud800"}',
    "'\\ud800'",  # a Python escape (decoded output holds no surrogate itself)
    "{1, 2}",
    "b'bytes'",
    "1j",
    "2+3j",
    'f"{1}"',
    "f'{" + "-" * 3000 + "1}'",
    '"\\q"',
    "'''" + "(" * 500,
    "\x00",
    "# (((",
    '{"a": nope}',
    "[1, 2",
    "}" * 50 + "{" * 50,
]

# Call bodies as the families write them, X where the arguments or a value go.
BODIES = [
    '{"name": "get", "arguments": X}',
    '{"name": "get", "arguments": {"a": X}}',
    '{"name": "get", "parameters": {"a": X}}',
    '{"name": "get", "arguments": "X"}',
    '[{"name": "get", "arguments": {"a": X}}]',
    '[{"name": "get", "arguments": {"a": 1}, "id": X}]',
    '[{"tool_name": "get", "parameters": {"a": X}}]',
    '```json\n[{"tool_name": "get", "parameters": {"a": X}}]\n```',
    '[{"get": X}]',
    '{"name": X, "arguments": {}}',
    "get<arg_key>a</arg_key><arg_value>X</arg_value>",
    "<function=get>\n<parameter=a>\nX\n</parameter>\n</function>",
    "[get(a=X)]",
    "[get(a=X), get(a=X)]",
    "get(a=X)",
    "call:get{a:X}",
    'call:get{a:X,s:<|"|>t<|"|>}',
    "functions.get:0<|tool_call_argument_begin|>X",
    "get<｜tool▁sep｜>X",
    "function<｜tool▁sep｜>get\n```json\nX\n```",
    'get">\n<｜DSML｜parameter name="a" string="false">X</｜DSML｜parameter>\n',
    "get[ARGS]X",
    "get[CALL_ID]c1[ARGS]X",
    "get<|channel|>commentary json<|message|>X",
    '<invoke name="get"><parameter name="a">X</parameter></invoke>',
    "id1<|tool_call:name|>get<|tool_call:args|>X",
    'get" index="0"<|sep|><|open|>argument key="a" type="object"<|sep|>X<|close|>argument<|sep|>',
    'get"<|sep|><|open|>json type="object"<|sep|>X<|close|>json<|sep|>',
    "get<tool_sep:opensource><arg_key:opensource>a</arg_key:opensource>"
    "<arg_value:opensource>X</arg_value:opensource>",
    'get"><param name="a">X</param>',
    "get>X",
    "get\nX",
    ']<]minimax[>[<invoke name="get">]<]minimax[>[<a>X]<]minimax[>[</a>',
    'self<|message|><atem:function_calls><atem:invoke name="get">'
    '<atem:parameter name="a">X</atem:parameter></atem:invoke>',
]

GARBAGE = ["", " ", "\n", "text", "{", "}", "[", "]", "(", '"', "'", "<", ">", "|", ":", "="]


def _markers(family: str) -> list[str]:
    m = MARKUPS[family]
    out = [*(m.think or ()), *(c for c in (m.call or ()) if c), *(m.section or ()), *m.drop]
    return out + [m.lead, m.prompt_tail] if m.lead or m.prompt_tail else out


def _call(family: str, body: str) -> str:
    """`body` between the family's call markers (inside its section where it has one)."""
    m = MARKUPS[family]
    opener, closer = m.call
    call = opener + body + (closer or "")
    if m.section:
        call = m.section[0] + call + m.section[1]
    return ("<|start|>assistant" if m.call_at else "") + call


def _pieces(text: str, rng: random.Random) -> list[str]:
    out, at = [], 0
    while at < len(text):
        n = rng.choice((1, 2, 3, 7, 40, 500))
        out.append(text[at : at + n])
        at += n
    return out


def _read(family: str, output: str, pieces: list[str] | None, tool_calls: bool = True):
    """The parts of `output` (fed whole, or in `pieces`), checked: every part well
    formed, every parsed value one the wire carries."""
    parser = make_parser(family, tool_calls=tool_calls, tools=TOOLS)
    parts = []
    for piece in pieces or [output]:
        parts += parser.feed(piece)
    parts += parser.close()
    started, deltas = set(), {}
    for p in parts:
        if isinstance(p, (TextPart, ReasoningPart)):
            assert isinstance(p.text, str) and p.text
        elif isinstance(p, ToolCallStart):
            assert isinstance(p.name, str) and p.name and p.index not in started
            started.add(p.index)
        elif isinstance(p, ToolCallDelta):
            assert p.index in started
            deltas[p.index] = deltas.get(p.index, "") + p.arguments_text
        else:
            assert isinstance(p, ToolCallEnd), p
            if p.arguments is not None:
                assert isinstance(p.arguments, dict) and p.index in started
                json.dumps(p.arguments, ensure_ascii=False, allow_nan=False).encode()
            elif p.index not in started:
                assert isinstance(p.raw, str)  # not a call: its text, returned as text
    return parts


def _shown(parts) -> str:
    """Everything of the output the client is given: text, reasoning, calls' raw texts
    and arguments."""
    out = []
    for p in parts:
        if isinstance(p, (TextPart, ReasoningPart)):
            out.append(p.text)
        elif isinstance(p, ToolCallDelta):
            out.append(p.arguments_text)
        elif isinstance(p, ToolCallEnd):
            out.append(p.raw or "")
            out.append(json.dumps(p.arguments) if p.arguments else "")
    return "".join(out)


def _families():
    return [f for f in FAMILIES if MARKUPS[f].call is not None]


@pytest.mark.parametrize("family", _families())
def test_adversarial_values_in_a_call_read_back_whole_and_streamed(family):
    rng = random.Random(f"values {family}")
    runs = 0
    for payload in PAYLOADS:
        for body in rng.sample(BODIES, 4):
            output = "Sure. " + _call(family, body.replace("X", payload))
            whole = _read(family, output, None)
            streamed = _read(family, output, _pieces(output, rng))
            runs += 2
            for parts in (whole, streamed):
                if not any(isinstance(p, ToolCallStart) for p in parts):
                    # nothing became a call: the value comes back as text (raw)
                    assert payload[:40] in _shown(parts) or (
                        not MARKUPS[family].call[1]  # cut by the output's end: dropped
                    ), (family, output[:200])
    assert runs > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_random_mixes_of_markers_and_garbage_read_back(family):
    rng = random.Random(f"mixes {family}")
    tokens = _markers(family) + GARBAGE + PAYLOADS[:4] + ["get", '"a"', "X"]
    runs = 0
    for _ in range(examples(150, 5000)):
        output = "".join(rng.choice(tokens) for _ in range(rng.randint(1, 12)))
        output = output.replace("X", rng.choice(PAYLOADS))
        for name in (family, family + THINKING):
            _read(name, output, None)
            _read(name, output, _pieces(output, rng))
            runs += 2
        _read(family, output, None, tool_calls=False)
        runs += 1
    assert runs > 0


def test_output_without_markup_comes_back_as_the_text_fed():
    rng = random.Random("plain")
    runs = 0
    for family in FAMILIES:
        for payload in PAYLOADS:
            output = "x " + payload.replace("\x00", "")
            parts = _read(family, output, _pieces(output, rng), tool_calls=False)
            if not any(k in output for k in _markers(family) if k):
                # (functionary v3.2's prompt tail `>>>` opens its output; with no tools
                # and no `all` message after it, it comes back as text too)
                text = "".join(p.text for p in parts)
                assert text.removeprefix(MARKUPS[family].prompt_tail) == output, family
            runs += 1
    assert runs > 0


def test_depth_is_measured_as_the_engine_measures_it_and_refused_before_parsing():
    rng = random.Random("depth")
    for _ in range(300):
        text = "".join(rng.choice('[]{}"\\ ,:1a') for _ in range(rng.randint(0, 40)))
        assert json_depth(text) == text_depth(text), text
    deep = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    assert json_value(deep, "refused") == "refused"
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json_value(ok) is not None
    assert python_literal_text("[" * 150 + "]" * 150, "refused") == "refused"
    assert python_literal_text("{'a': [1, (2, 3)], 'b': None}") == {"a": [1, (2, 3)], "b": None}
