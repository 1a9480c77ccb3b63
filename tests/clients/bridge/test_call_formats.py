"""The output parsers of the families whose calls are lists, run to the output's end, open
without a marker, or have a syntax of their own: each case whole, in two at every
position and one character at a time gives the same text, reasoning and calls, and no
markup reaches the text. (The published templates' own renders: test_published_round_trips.)
"""

from __future__ import annotations

import pytest

from clients.bridge.parsers import FAMILIES, joined
from engine.config.prompt import OUTPUT_FAMILIES
from tests.clients.bridge.test_parsers import _parse, _splits

PARIS = ("get_weather", {"city": "Paris", "days": 2})
ROME = ("get_weather", {"city": "Rome"})

# (id, family, output, text, reasoning, [(name, arguments)])
CASES = [
    (
        "llama3 json",
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
        "",
        "",
        [ROME],
    ),
    (
        "llama3 python_tag, two by ;",
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
        "",
        "",
        [PARIS, ROME],
    ),
    ("llama3 text that is JSON", "llama3_json", '{"answer": 4}', '{"answer": 4}', "", []),
    ("llama3 prose", "llama3_json", "It is {mild} today.", "It is {mild} today.", "", []),
    (
        "pythonic",
        "pythonic",
        '[get_weather(city="Paris", days=2), get_weather(city="Rome")]',
        "",
        "",
        [PARIS, ROME],
    ),
    (
        "pythonic in python_start",
        "pythonic",
        'Checking.<|python_start|>[get_weather(city="Rome")]<|python_end|>',
        "Checking.",
        "",
        [ROME],
    ),
    ("pythonic prose in brackets", "pythonic", "[1] is a note.", "[1] is a note.", "", []),
    (
        "mistral list",
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome"}}]',
        "",
        "",
        [PARIS, ROME],
    ),
    (
        "mistral name[ARGS], reasoning",
        "mistral",
        '[THINK]two cities[/THINK]Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}'
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Rome"}',
        "Sure.",
        "two cities",
        [PARIS, ROME],
    ),
    (
        "harmony analysis then a call",
        "harmony",
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}<|call|>',
        "",
        "Need the weather.",
        [ROME],
    ),
    (
        "harmony final",
        "harmony",
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>"
        "Four.<|return|>",
        "Four.",
        "Easy.",
        [],
    ),
    (
        "gemma4 thought and call",
        "gemma4",
        "<|channel>thought\nweather<channel|>"
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>',
        "",
        "weather",
        [PARIS],
    ),
    (
        "gemma4 nested",
        "gemma4",
        '<|tool_call>call:f{a:{b:[1,<|"|>x, y<|"|>]},c:true}<tool_call|>',
        "",
        "",
        [("f", {"a": {"b": [1, "x, y"]}, "c": True})],
    ),
    (
        "command r+",
        "command_r",
        'Action: ```json\n[{"tool_name": "get_weather", "parameters": {"city": "Rome"}}]\n```',
        "",
        "",
        [ROME],
    ),
    (
        "command r7b",
        "command_r7b",
        "<|START_THINKING|>Look it up.<|END_THINKING|><|START_ACTION|>["
        '{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Rome"}}]'
        "<|END_ACTION|>",
        "",
        "Look it up.",
        [ROME],
    ),
    (
        "command r7b response",
        "command_r7b",
        "<|START_RESPONSE|>Rainy.<|END_RESPONSE|>",
        "Rainy.",
        "",
        [],
    ),
    (
        "minimax",
        "minimax",
        '<think>two</think>\n<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="city">Paris</parameter>\n<parameter name="days">2</parameter>\n'
        '</invoke>\n<invoke name="get_weather">\n<parameter name="city">Rome</parameter>\n'
        "</invoke>\n</minimax:tool_call>",
        "",
        "two",
        [PARIS, ROME],
    ),
    (
        "nemotron",
        "nemotron",
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Rome"}}]</TOOLCALL>',
        "",
        "",
        [ROME],
    ),
    (
        "granite",
        "granite",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Rome"}}]',
        "",
        "",
        [ROME],
    ),
    (
        "phi4",
        "phi4",
        'functools[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
        "",
        "",
        [PARIS],
    ),
    (
        "deepseek R1 distill",
        "deepseek",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": "Rome"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        "",
        [ROME],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_split_gives_the_same_parts(case):
    _, family, output, text, reasoning, calls = case
    for pieces in _splits(output):
        got_text, got_reasoning, got_calls = joined(_parse(family, pieces))
        assert (got_text, got_reasoning) == (text, reasoning), pieces
        assert [(s.name, e.arguments) for s, e in got_calls] == calls, pieces


def test_the_engine_and_the_bridge_name_the_same_families():
    assert FAMILIES == OUTPUT_FAMILIES


# A call the output's end cut (max_tokens, a stop string) anywhere after its opening
# marker: no markup
# reaches the text, on the chat completions stream and on the blocks that Anthropic
# Messages and Responses stream.
CUT = [
    (
        "qwen",
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
    ),
    ("mistral", 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'),
    (
        "harmony",
        "<|channel|>final<|message|>Sure.<|end|><|start|>assistant to=functions.get_weather"
        '<|channel|>commentary json<|message|>{"city": "Rome"}<|call|>',
    ),
    ("gemma4", 'Sure.<|tool_call>call:get_weather{city:<|"|>Rome<|"|>}<tool_call|>'),
    (
        "minimax",
        'Sure.<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="city">Rome</parameter>\n</invoke>\n</minimax:tool_call>',
    ),
    (
        "command_r7b",
        'Sure.<|START_ACTION|>[{"tool_name": "get_weather", "parameters": {"city": "Rome"}}]'
        "<|END_ACTION|>",
    ),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]'),
    ("nemotron", 'Sure.<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Rome"}}]'),
    ("granite", 'Sure.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Rome"}}]'),
    ("phi4", 'Sure.functools[{"name": "get_weather", "arguments": {"city": "Rome"}}]'),
    (
        "command_r",
        'Sure.\nAction: ```json\n[{"tool_name": "get_weather", "parameters": {"city": "Rome"}}]',
    ),
    ("llama3_json", 'Sure.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}'),
    ("pythonic", 'Sure.<|python_start|>[get_weather(city="Rome", days=2)]<|python_end|>'),
]


@pytest.mark.parametrize("family, output", CUT, ids=[f"{c[0]} {c[1][5:20]}" for c in CUT])
def test_a_call_cut_by_the_outputs_end_leaks_no_markup(family, output):
    from clients.bridge.blocks import TEXT, Blocks
    from clients.bridge.chat_completions import ChatShape
    from clients.bridge.parsers import MARKUPS, make_parser
    from clients.wire import Final, Restore, Timing, Usage

    opener = MARKUPS[family].call[0]
    start = output.index(opener) + len(opener)  # (a cut inside a marker may be text)
    for end in range(start, len(output)):
        cut = output[:end]
        shape = ChatShape("r1", {"id": "tiny", "fingerprint": "fp"}, make_parser(family))
        chunks = [c for ch in cut for c in shape.delta(ch)]
        chunks += shape.finish(Final("length", Usage(1, 0, 1), Restore(), Timing(), "r1"))
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        blocks = Blocks(make_parser(family))
        for ch in cut:
            blocks.feed(ch, 1)
        blocks.close()
        texts = "".join(b.text for b in blocks.blocks if b.kind == TEXT)
        for shown in (content, texts):
            assert shown.strip() in ("Sure.", ""), (cut, shown)
