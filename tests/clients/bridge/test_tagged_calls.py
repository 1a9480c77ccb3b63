"""The families whose calls sit between tags of their own (Apertus, Apriel, Seed-OSS,
GigaChat 3 and 3.1, LFM2, Solar Open; clients.bridge.call_bodies_tagged): each output
whole, in two at every position and one character at a time gives the same text,
reasoning and calls; the streamed deltas join to the reader's arguments text; where
the family streams, the arguments go out before the call's end; a call the output's end
cuts leaks no markup. (The published templates' own renders: test_published_round_trips.)
"""

from __future__ import annotations

import json

import pytest

from clients.bridge.parsers import ToolCallDelta, ToolCallStart, joined, make_parser
from tests.clients.bridge.test_call_streams import _arguments, _whole
from tests.clients.bridge.test_parsers import _parse, _splits

PARIS = ("get_weather", {"city": "Paris", "days": 2})
ROME = ("get_weather", {"city": "Rome"})
P_ARGS, R_ARGS = '{"city": "Paris", "days": 2}', '{"city": "Rome"}'
SEED_P = (
    "<function=get_weather>\n<parameter=city>Paris</parameter>\n"
    "<parameter=days>2</parameter>\n</function>"
)

# (id, family, output, text, reasoning, [(name, arguments)])
CASES = [
    (
        "apertus two calls",
        "apertus",
        f'<|tools_prefix|>[{{"get_weather": {P_ARGS}}}, {{"get_weather": {R_ARGS}}}]'
        "<|tools_suffix|>",
        "",
        "",
        [PARIS, ROME],
    ),
    (
        "apertus thoughts and text",
        "apertus",
        "<|inner_prefix|>Two cities.<|inner_suffix|>Looking.<|tools_prefix|>"
        f'[{{"get_weather": {R_ARGS}}}]<|tools_suffix|>',
        "Looking.",
        "Two cities.",
        [ROME],
    ),
    (
        "apertus: arguments as a JSON string",
        "apertus",
        '<|tools_prefix|>[{"get_weather": "{\\"city\\": \\"Rome\\"}"}]<|tools_suffix|>',
        "",
        "",
        [ROME],
    ),
    (
        "apriel 1.6: reasoning, final response, calls with ids",
        "apriel-thinking",
        "Two cities.\n[BEGIN FINAL RESPONSE]\nLooking.\n<tool_calls>["
        f'{{"name": "get_weather", "arguments": {P_ARGS}, "id": "call0abcd"}}, '
        f'{{"name": "get_weather", "arguments": {R_ARGS}}}]</tool_calls>',
        "Looking.",
        "Two cities.",
        [PARIS, ROME],
    ),
    (
        "apriel 1.5: the model writes its reasoning header",
        "apriel",
        "Here are my reasoning steps:\nTwo cities.\n[BEGIN FINAL RESPONSE]\nSure."
        "[END FINAL RESPONSE]",
        "Sure.",
        "Two cities.",
        [],
    ),
    (
        "apriel: arguments as a JSON string",
        "apriel",
        '<tool_calls>[{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}]'
        "</tool_calls>",
        "",
        "",
        [ROME],
    ),
    (
        "seed-oss two calls after reasoning and text",
        "seed_oss",
        "<seed:think>Two cities.</seed:think>\nLooking.\n\n<seed:tool_call>\n"
        f"{SEED_P}\n</seed:tool_call>\n<seed:tool_call>\n<function=get_weather>\n"
        "<parameter=city>Rome</parameter>\n</function>\n</seed:tool_call>",
        "Looking.",
        "Two cities.",
        [PARIS, ROME],
    ),
    (
        "seed-oss: Python literals where Jinja's string wrote them",
        "seed_oss",
        "<seed:tool_call>\n<function=f>\n<parameter=ok>True</parameter>\n"
        "<parameter=d>{'a': [1, None]}</parameter>\n<parameter=s>a b</parameter>\n"
        "</function>\n</seed:tool_call>",
        "",
        "",
        [("f", {"ok": True, "d": {"a": [1, None]}, "s": "a b"})],
    ),
    (
        "gigachat 3: a function call message after the assistant's",
        "gigachat3",
        "Looking.<|message_sep|>\n\nfunction call<|role_sep|>\n"
        f'{{"name": "get_weather", "arguments": {P_ARGS}}}<|message_sep|>\n\n',
        "Looking.",
        "",
        [PARIS],
    ),
    (
        "gigachat 3.1",
        "gigachat3_1",
        f'Looking.<|function_call|>{{"name": "get_weather", "arguments": {R_ARGS}}}'
        "<|message_sep|>\n\n",
        "Looking.",
        "",
        [ROME],
    ),
    (
        "gigachat 3.1: text alone",
        "gigachat3_1",
        "It is sunny.<|message_sep|>\n\n",
        "It is sunny.",
        "",
        [],
    ),
    (
        "lfm2.5 pythonic, two calls",
        "lfm2",
        "<think>Two cities.</think>Looking.<|tool_call_start|>"
        "[get_weather(city='Paris', days=2), get_weather(city='Rome')]<|tool_call_end|>",
        "Looking.",
        "Two cities.",
        [PARIS, ROME],
    ),
    (
        "lfm2.5: a dict argument written by tojson",
        "lfm2",
        '<|tool_call_start|>[f(o={"a": true, "b": null}, n=False)]<|tool_call_end|>',
        "",
        "",
        [("f", {"o": {"a": True, "b": None}, "n": False})],
    ),
    (
        "lfm2: a JSON list",
        "lfm2",
        f'<|tool_call_start|>[{{"name": "get_weather", "arguments": {R_ARGS}}}]<|tool_call_end|>',
        "",
        "",
        [ROME],
    ),
    (
        "solar open: reasoning, then two calls",
        "solar_open",
        "<|think|>Two cities.<|end|><|begin|>assistant<|tool_calls|>"
        f"<|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>get_weather<|tool_call:args|>{P_ARGS}"
        f"<|tool_call:end|><|tool_call:begin|>f6g7h8i9j0<|tool_call:name|>get_weather"
        f"<|tool_call:args|>{R_ARGS}<|tool_call:end|><|calls|>",
        "",
        "Two cities.",
        [PARIS, ROME],
    ),
    (
        "solar open: reasoning, then content",
        "solar_open",
        "<|think|>Easy.<|end|><|begin|>assistant<|content|>It is sunny.<|end|>",
        "It is sunny.",
        "Easy.",
        [],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_split_gives_the_same_parts(case):
    _, family, output, text, reasoning, calls = case
    for pieces in _splits(output):
        got_text, got_reasoning, got_calls = joined(_parse(family, pieces))
        assert (got_text, got_reasoning) == (text, reasoning), pieces
        assert [(s.name, e.arguments) for s, e in got_calls] == calls, pieces


@pytest.mark.parametrize("case", [c for c in CASES if c[5]], ids=[c[0] for c in CASES if c[5]])
def test_every_split_streams_the_readers_arguments_text(case):
    _, family, output, *_ = case
    expected = _whole(family, output)
    assert expected and all(json.loads(a) is not None for a in expected)
    for pieces in _splits(output):
        parts = _parse(family, pieces)
        starts = [p for p in parts if isinstance(p, ToolCallStart)]
        assert [_arguments(parts, s.index) for s in starts] == expected, pieces


def test_solar_open_keeps_the_models_call_ids():
    """The template renders the id back into the tool results: the model's own one."""
    output = CASES[[c[0] for c in CASES].index("solar open: reasoning, then two calls")][2]
    for pieces in _splits(output):
        starts = [p for p in _parse("solar_open", pieces) if isinstance(p, ToolCallStart)]
        assert [s.call_id for s in starts] == ["a1b2c3d4e5", "f6g7h8i9j0"]


# (family, output): one call with a parameter or JSON arguments, in the families that stream
EARLY = [
    ("apertus", '<|tools_prefix|>[{"f": {"city": "Rome"}}]<|tools_suffix|>'),
    ("apriel", '<tool_calls>[{"name": "f", "arguments": {"city": "Rome"}}]</tool_calls>'),
    ("seed_oss", "<seed:tool_call>\n<function=f>\n<parameter=city>Rome</parameter>\n</function>"),
    ("gigachat3", 'function call<|role_sep|>\n{"name": "f", "arguments": {"city": "Rome"}}'),
    ("gigachat3_1", '<|function_call|>{"name": "f", "arguments": {"city": "Rome"}}'),
    (
        "solar_open",
        '<|tool_calls|><|tool_call:begin|>x<|tool_call:name|>f<|tool_call:args|>{"city": "Rome"}'
        "<|tool_call:end|>",
    ),
]


@pytest.mark.parametrize("family, output", EARLY, ids=[c[0] for c in EARLY])
def test_the_arguments_stream_before_the_call_ends(family, output):
    """Fed a character at a time: the name and `"city"` go out before the call's end."""
    p, seen = make_parser(family), []
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
    settled = len(output) - 1 if family == "seed_oss" else output.index("Rome")
    assert start < city < settled, seen
    parts = [part for _, part in seen]
    assert json.loads(_arguments(parts, 0)) == {"city": "Rome"}


@pytest.mark.parametrize("case", [c for c in CASES if c[5]], ids=[c[0] for c in CASES if c[5]])
def test_a_call_cut_by_the_outputs_end_leaks_no_markup(case):
    """Cut anywhere inside the first call, after its opening marker (max_tokens, a stop
    string): the text on the chat completions stream and in the blocks Anthropic
    Messages and Responses stream is what came before the call, never its markup."""
    from clients.bridge.blocks import TEXT, Blocks
    from clients.bridge.chat_completions import ChatShape
    from clients.wire import Final, Restore, Timing, Usage

    _, family, output, text, *_ = case
    opener, closer = make_parser(family).markup.call
    start = output.index(opener) + len(opener)
    for end in range(start, output.index(closer, start) + len(closer)):
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
            assert shown.strip() in (text, ""), (cut, shown)


@pytest.mark.parametrize("family, output", EARLY, ids=[c[0] for c in EARLY])
def test_the_chat_stream_sends_the_call_in_pieces(family, output):
    """On chat completions: one `tool_calls` entry with the name, then argument pieces
    that join to the call's arguments."""
    from clients.bridge.chat_completions import ChatShape
    from clients.wire import Final, Restore, Timing, Usage

    shape = ChatShape("r1", {"id": "tiny", "fingerprint": "fp"}, make_parser(family))
    chunks = [c for ch in output for c in shape.delta(ch)]
    chunks += shape.finish(Final("stop", Usage(1, 0, 1), Restore(), Timing(), "r1"))
    calls = [t for c in chunks for t in c["choices"][0]["delta"].get("tool_calls", ())]
    assert calls[0]["function"]["name"] == "f"
    pieces = [t["function"]["arguments"] for t in calls[1:]]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"city": "Rome"}
