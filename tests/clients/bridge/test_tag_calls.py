"""The output parsers of the families whose calls are tags (clients.bridge.tag_calls):
each case whole, in two at every position and one character at a time gives the same
text, reasoning and calls, and no markup reaches the text; a call streams its
parameters before it ends; a call the output's end cuts leaks no markup. (The
published templates' own renders: test_published_round_trips.)
"""

from __future__ import annotations

import json

import pytest

from clients.bridge.parsers import (
    MARKUPS,
    THINKING,
    ToolCallDelta,
    ToolCallStart,
    joined,
    make_parser,
)
from tests.clients.bridge.test_parsers import _parse, _splits

PARIS = ("get_weather", {"city": "Paris", "days": 2})
ROME = ("get_weather", {"city": "Rome"})
NS = "]<]minimax[>["
K3_PARIS = (
    '<|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" '
    'type="string"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key="days" '
    'type="number"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|>'
)
K3_ROME = (
    '<|open|>call tool="get_weather" index="2"<|sep|><|open|>json type="object"<|sep|>'
    '{"city": "Rome"}<|close|>json<|sep|><|close|>call<|sep|>'
)
ATEM_PARIS = (
    '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">'
    'Paris</atem:parameter>\n<atem:parameter name="days">2</atem:parameter>\n</atem:invoke>\n'
    "</atem:function_calls>"
)
HY = ":opensource"

# (id, family, output, text, reasoning, [(name, arguments)])
CASES = [
    (
        "kimi_k3 reasoning, text, two calls",
        "kimi_k3-thinking",
        "Two cities.<|close|>think<|sep|><|open|>response<|sep|>Looking.<|close|>response<|sep|>"
        f"<|open|>tools<|sep|>{K3_PARIS}{K3_ROME}<|close|>tools<|sep|><|close|>message<|sep|>",
        "Looking.",
        "Two cities.",
        [PARIS, ROME],
    ),
    (
        "kimi_k3 text only, an escaped attribute",
        "kimi_k3",
        '<|open|>response<|sep|>Say "<hi>".<|close|>response<|sep|><|open|>tools<|sep|>'
        '<|open|>call tool="say" index="1"<|sep|><|open|>argument key="a&quot;b" type="string"'
        "<|sep|>x<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
        'Say "<hi>".',
        "",
        [("say", {'a"b': "x"})],
    ),
    (
        "minimax_m1 reasoning and two lines",
        "minimax_m1",
        '<think>Two.</think>\nSure.\n<tool_calls>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "days": 2}}\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
        "</tool_calls>",
        "Sure.",
        "Two.",
        [PARIS, ROME],
    ),
    (
        "minimax_m3 nested values",
        "minimax_m3",
        f'</mm:think>Sure.{NS}<tool_call>\n{NS}<invoke name="plan">{NS}<stops>{NS}<item>Paris'
        f"{NS}</item>{NS}<item>Rome{NS}</item>{NS}</stops>{NS}<opts>{NS}<fast>true{NS}</fast>"
        f'{NS}</opts>{NS}</invoke>\n{NS}<invoke name="get_weather">{NS}<city>Rome{NS}</city>'
        f"{NS}</invoke>\n{NS}</tool_call>",
        "Sure.",
        "",
        [("plan", {"stops": ["Paris", "Rome"], "opts": {"fast": True}}), ROME],
    ),
    (
        "minimax_m3 reasoning",
        "minimax_m3",
        f'<mm:think>Weather.</mm:think>{NS}<tool_call>\n{NS}<invoke name="get_weather">{NS}'
        f"<city>Paris{NS}</city>{NS}<days>2{NS}</days>{NS}</invoke>\n{NS}</tool_call>",
        "",
        "Weather.",
        [PARIS],
    ),
    (
        "atem reasoning and two calls",
        "atem",
        f" to=self<|message|>Two cities.<|eom|><|start|>assistant to=get_weather<|message|>"
        f"{ATEM_PARIS}<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>\n"
        '<atem:invoke name="get_weather">\n<atem:parameter name="city">Rome</atem:parameter>\n'
        "</atem:invoke>\n</atem:function_calls>",
        "",
        "Two cities.",
        [PARIS, ROME],
    ),
    (
        "atem text that says to=",
        "atem",
        " to=user<|message|>Set x to=5, then y to= 6.<|eot|>",
        "Set x to=5, then y to= 6.",
        "",
        [],
    ),
    (
        "minicpm CDATA, Python values, two calls",
        "minicpm",
        '<think>\nTwo.\n</think>\n\nSure.\n<function name="write"><param name="text">'
        '<![CDATA[a < b\n& c]]></param><param name="force">True</param></function>\n'
        '<function name="get_weather"><param name="city">Rome</param></function>',
        "Sure.",
        "Two.",
        [("write", {"text": "a < b\n& c", "force": True}), ROME],
    ),
    (
        "hy3 reasoning and two calls",
        "hy3",
        f"<think{HY}>Two.</think{HY}>Sure.<tool_calls{HY}>\n<tool_call{HY}>get_weather"
        f"<tool_sep{HY}>\n<arg_key{HY}>city</arg_key{HY}>\n<arg_value{HY}>Paris</arg_value{HY}>\n"
        f"<arg_key{HY}>days</arg_key{HY}>\n<arg_value{HY}>2</arg_value{HY}>\n</tool_call{HY}>\n"
        f"<tool_call{HY}>get_weather<tool_sep{HY}>\n<arg_key{HY}>city</arg_key{HY}>\n"
        f"<arg_value{HY}>Rome</arg_value{HY}>\n</tool_call{HY}>\n</tool_calls{HY}>",
        "Sure.",
        "Two.",
        [PARIS, ROME],
    ),
]


CASES += [
    (
        "functionary v3.1 text and two calls",
        "functionary_v3_1",
        'Sure.<function=get_weather>{"city": "Paris", "days": 2}</function>'
        '<function=get_weather>{"city": "Rome"}</function>',
        "Sure.",
        "",
        [PARIS, ROME],
    ),
    # the python tool's code after `<|python_tag|>`, as the model writes it (llama.cpp's
    # reading: the rest of the output), and as the published template writes a past one
    (
        "functionary v3.1 code after the python tag",
        "functionary_v3_1",
        'Sure.<|python_tag|>import math\nprint({"r": math.pi})\n',
        "Sure.",
        "",
        [("python", {"code": 'import math\nprint({"r": math.pi})'})],
    ),
    (
        "functionary v3.1 a past code call as the template writes it",
        "functionary_v3_1",
        '<|python_tag|>{"code": "print(1)"}',
        "",
        "",
        [("python", {"code": "print(1)"})],
    ),
    (
        "functionary v3.2 text, two calls, text",
        "functionary_v3_2",
        'all\nSure.>>>get_weather\n{"city": "Paris", "days": 2}>>>get_weather\n'
        '{"city": "Rome"}>>>all\nDone.',
        "Sure.Done.",
        "",
        [PARIS, ROME],
    ),
    (
        "functionary v3.2 a call first",
        "functionary_v3_2",
        'get_weather\n{"city": "Paris", "days": 2}',
        "",
        "",
        [PARIS],
    ),
    ("functionary v3.2 text only", "functionary_v3_2", "all\nA > B >> C", "A > B >> C", "", []),
    # the model's text without its recipient: text all the same
    ("functionary v3.2 bare text", "functionary_v3_2", "Hello there.", "Hello there.", "", []),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_split_gives_the_same_parts(case):
    _, family, output, text, reasoning, calls = case
    for pieces in _splits(output):
        got_text, got_reasoning, got_calls = joined(_parse(family, pieces))
        assert (got_text, got_reasoning) == (text, reasoning), pieces
        assert [(s.name, e.arguments) for s, e in got_calls] == calls, pieces


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_call_streams_its_first_parameter_before_it_ends(case):
    """Fed a character at a time, the first call's first argument goes out before the
    call's last character has come (a JSON block comes whole: Kimi K3's `json`)."""
    _, family, output, _, _, calls = case
    if not calls:
        return
    p, seen = make_parser(family), []
    for i, ch in enumerate(output):
        seen += [(i, part) for part in p.feed(ch)]
    start = next(i for i, part in seen if isinstance(part, ToolCallStart))
    key = json.dumps(next(iter(calls[0][1])))
    first = next(
        i
        for i, part in seen
        if isinstance(part, ToolCallDelta)
        and key
        in "".join(
            q.arguments_text
            for _, q in seen[: seen.index((i, part)) + 1]
            if isinstance(q, ToolCallDelta) and q.index == 0
        )
    )
    assert start <= first < len(output) - 1


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_call_cut_by_the_outputs_end_leaks_no_markup(case):
    """Cut anywhere inside the first call, or the section of calls it opens (max_tokens, a
    stop string): the text is what came before the call, and no markup."""
    _, family, output, text, _, calls = case
    if not calls:
        return
    markup = MARKUPS[family.removesuffix(THINKING)]
    opener, closer = markup.call
    if markup.prompt_tail:  # functionary v3.2: the call runs from its name to the next >>>
        at = output.index("get_weather")
        stop = output.find(closer, at)
        for end in range(at + 1, stop if stop > 0 else len(output)):
            got_text, _, _ = joined(_parse(family, [output[:end]]))
            assert got_text == text.partition("Done.")[0], output[:end]
        return
    if markup.code_call and markup.code_call[0] in output:  # code to the output's end
        at = output.index(markup.code_call[0])
        for end in range(at + len(markup.code_call[0]), len(output)):
            got_text, _, _ = joined(_parse(family, [output[:end]]))
            assert got_text == text, output[:end]
        return
    at = output.index(opener + ("get" if opener == " to=" else ""))
    last = output.rindex(markup.section[1]) if markup.section else output.index(closer, at)
    for end in range(at + len(opener), last + len(closer)):  # to the section's end
        got_text, _, _ = joined(_parse(family, [output[:end]]))
        assert got_text == text, output[:end]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_wire_formats_carry_the_calls_and_the_text(case):
    """Chat completions' stream (tool_calls deltas whose arguments join to the call's) and
    the blocks Anthropic Messages and Responses stream (text blocks without markup) carry
    the case's text and calls, fed a character at a time."""
    from clients.bridge.blocks import TEXT, Blocks
    from clients.bridge.chat_completions import ChatShape
    from clients.wire import Final, Restore, Timing, Usage

    _, family, output, text, _, calls = case
    shape = ChatShape("r1", {"id": "tiny", "fingerprint": "fp"}, make_parser(family))
    chunks = [c for ch in output for c in shape.delta(ch)]
    chunks += shape.finish(Final("stop", Usage(1, 0, 1), Restore(), Timing(), "r1"))
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    content = "".join(d.get("content") or "" for d in deltas)
    names, arguments = {}, {}
    for d in deltas:
        for call in d.get("tool_calls") or ():
            fn = call.get("function", {})
            if fn.get("name"):
                names[call["index"]] = fn["name"]
            arguments[call["index"]] = arguments.get(call["index"], "") + fn.get("arguments", "")
    got = [(names[i], json.loads(arguments[i])) for i in sorted(names)]
    assert (content, got) == (text, calls)
    blocks = Blocks(make_parser(family))
    for ch in output:
        blocks.feed(ch, 1)
    blocks.close()
    assert "".join(b.text for b in blocks.blocks if b.kind == TEXT) == text
