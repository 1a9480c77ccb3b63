"""Tool grammars of every output family: the family's own markup, held in the batch.

Each family's call, as its published chat template writes a past call, is accepted by
its `required` and lazy `auto` grammars, and a call with a bad argument is not: on
the embedded tokenizer (where the family's markers are text, but Qwen's four) and on
a copy whose added tokens are the family's markers instead (where they are single
tokens). In the batch, on the random-weight model at temperature 1 (garbage but for
the mask), every `required` and named output reads back (tests/runtime/structured/
tool_calls.py) as calls of the allowed tools with arguments valid for their schemas.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from clients.bridge.parsers import joined, make_parser
from engine.runtime.events import FinishReason
from engine.runtime.structured.grammar import GrammarError, tool_grammar
from engine.runtime.structured.markup import FAMILIES, markers_of, token_markers
from engine.runtime.structured.matcher import Grammars
from tests.runtime.structured.test_matcher import SEARCH, WEATHER, run
from tests.runtime.structured.tool_calls import calls
from tests.tokenizers import tokenizer_dir

VOCAB, STOP = 4096, 2
ARGS = '{"city": "Paris", "unit": "c"}'
BAD = ARGS.replace('"c"', '"k"')
Q = '<|"|>'
NS, HY = "]<]minimax[>[", ":opensource"
# What each family's model writes for get_weather(city="Paris", unit="c"), after its
# published template (llama.cpp's models/templates); some families in two forms.
WRITTEN = {
    "qwen": [f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>'],
    "qwen_xml": [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>"
    ],
    "glm": [
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>unit</arg_key>\n<arg_value>c</arg_value>\n</tool_call>",  # GLM-4.5/4.6
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>unit</arg_key><arg_value>c</arg_value></tool_call>",  # GLM-4.7
    ],
    "kimi": [
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        f"<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>"
    ],
    "deepseek": [
        f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{ARGS}"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",  # V3.1
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        f"```json\n{ARGS}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",  # R1
    ],
    "dsml": [
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="unit" string="true">c</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>"
    ],
    "minimax": [
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
        '</parameter>\n<parameter name="unit">c</parameter>\n</invoke>\n</minimax:tool_call>'
    ],
    "llama3_json": [
        f'{{"name": "get_weather", "parameters": {ARGS}}}',
        f'<|python_tag|>{{"name": "get_weather", "parameters": {ARGS}}}',
    ],
    "pythonic": ['[get_weather(city="Paris", unit="c")]'],
    "mistral": [
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {ARGS}}}]',  # Nemo
        f"[TOOL_CALLS]get_weather[ARGS]{ARGS}",  # Small 3.2, Devstral
    ],
    "harmony": [
        "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}<|call|>",
        f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}<|call|>",
    ],
    "gemma4": [f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},unit:{Q}c{Q}}}<tool_call|>"],
    "command_r": [
        'Action:\n```json\n[\n    {\n        "tool_name": "get_weather",\n        '
        '"parameters": {\n            "city": "Paris",\n            "unit": "c"\n        }\n'
        "    }\n]\n```"
    ],
    "command_r7b": [
        '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
        f'"parameters": {ARGS}}}\n]<|END_ACTION|>'
    ],
    "nemotron": [f'<TOOLCALL>[{{"name": "get_weather", "arguments": {ARGS}}}]</TOOLCALL>'],
    "granite": [f'<|tool_call|>[{{"name": "get_weather", "arguments": {ARGS}}}]'],
    "phi4": [f'functools[{{"name": "get_weather", "arguments": {ARGS}}}]'],
    "apertus": [f'<|tools_prefix|>[{{"get_weather": {ARGS}}}]<|tools_suffix|>'],
    "apriel": [f'<tool_calls>[{{"name": "get_weather", "arguments": {ARGS}}}]</tool_calls>'],
    "seed_oss": [
        "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
        "<parameter=unit>c</parameter>\n</function>\n</seed:tool_call>"
    ],
    "gigachat3": [
        "<|message_sep|>\n\nfunction call<|role_sep|>\n"
        f'{{"name": "get_weather", "arguments": {ARGS}}}<|message_sep|>\n\n'
    ],
    "gigachat3_1": [
        f'<|function_call|>{{"name": "get_weather", "arguments": {ARGS}}}<|message_sep|>\n\n'
    ],
    "lfm2": ['<|tool_call_start|>[get_weather(city="Paris", unit="c")]<|tool_call_end|>'],
    "solar_open": [
        "<|tool_calls|><|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>get_weather"
        f"<|tool_call:args|>{ARGS}<|tool_call:end|><|calls|>"
    ],
    # calls written as tags
    "kimi_k3": [
        "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
        '<|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" '
        'type="string"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key="unit" '
        'type="string"<|sep|>c<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'
        "<|close|>message<|sep|>"
    ],
    "minimax_m1": [f'<tool_calls>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_calls>'],
    "minimax_m3": [
        f'{NS}<tool_call>\n{NS}<invoke name="get_weather">{NS}<city>Paris{NS}</city>'
        f"{NS}<unit>c{NS}</unit>{NS}</invoke>\n{NS}</tool_call>"
    ],
    "atem": [
        ' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
        '<atem:parameter name="city">Paris</atem:parameter>\n<atem:parameter name="unit">c'
        "</atem:parameter>\n</atem:invoke>\n</atem:function_calls>"
    ],
    "minicpm": [
        '<function name="get_weather"><param name="city">Paris</param><param name="unit">c'
        "</param></function>"
    ],
    "hy3": [
        f"<tool_calls{HY}>\n<tool_call{HY}>get_weather<tool_sep{HY}>\n<arg_key{HY}>city"
        f"</arg_key{HY}>\n<arg_value{HY}>Paris</arg_value{HY}>\n<arg_key{HY}>unit</arg_key{HY}>\n"
        f"<arg_value{HY}>c</arg_value{HY}>\n</tool_call{HY}>\n</tool_calls{HY}>"
    ],
}
# the reasoning a tag family's model may write before its calls, where its grammar allows it
OWN_REASONING = {
    "atem": " to=self",
    "minimax_m1": "<think>",
    "minimax_m3": "<mm:think>",
    "minicpm": "<think>",
    "hy3": "<think:opensource>",
}
WRITTEN["functionary_v3_1"] = [f"<function=get_weather>{ARGS}</function>"]
WRITTEN["functionary_v3_2"] = [f"get_weather\n{ARGS}"]
# a tag family's block of calls: (its start, its end), or the text between two calls
TWO_TAGS = {
    "kimi_k3": ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>"),
    "minimax_m1": ("<tool_calls>", "\n</tool_calls>"),
    "minimax_m3": ("<tool_call>\n", f"{NS}</tool_call>"),
    "hy3": (f"<tool_calls{HY}>\n", f"</tool_calls{HY}>"),
    "atem": "<|eom|><|start|>assistant",
    "minicpm": "\n",
    "functionary_v3_1": "",
    "functionary_v3_2": ">>>",
}
TEXT_MARKERS = {"Action:", "functools", "["}  # ordinary words, never added tokens
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, SEARCH)}
# no free text before calls
LEADING = (
    "llama3_json",
    "pythonic",
    "harmony",
    "solar_open",
    "kimi_k3",
    "atem",
    "functionary_v3_2",
)
ONE = ("llama3_json", "harmony", "gigachat3", "gigachat3_1")  # one call per turn


def _two(family: str, text: str) -> str:
    """The same call twice in one turn, as the family writes parallel calls."""
    markup = FAMILIES[family]
    if isinstance(TWO_TAGS.get(family), str):
        return text + TWO_TAGS[family] + text
    if family in TWO_TAGS:
        head, tail = TWO_TAGS[family]
        first, last = text.index(head) + len(head), text.rindex(tail)
        return text[:last] + text[first:last] + text[last:]
    if markup.shape == "calls" or text.startswith("[TOOL_CALLS]get_weather"):
        return text + markup.sep + text
    if markup.shape == "section":
        head = markup.section_open + ("\n" if family in ("dsml", "minimax") else "")
        inner = text[len(head) : -len(markup.section_close)]
        return head + inner + inner + markup.section_close
    if family == "solar_open":
        first, last = text.index("<|tool_call:begin|>"), text.index("<|calls|>")
        return text[:last] + text[first:last].replace("a1b2", "b2c3") + text[last:]
    after = len(markup.opener) if markup.opener == "[TOOL_CALLS]" else 0
    first, last = text.index("[", after), text.rindex("]")  # a list of calls
    inner = text[first + 1 : last]
    return text[: first + 1] + inner + ", " + inner + text[last:]


def test_every_family_has_its_markup_written_here():
    assert set(WRITTEN) == set(FAMILIES)


def _load(path):
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(path)


def _family_tokenizer(dst, family):
    """The embedded tokenizer whose four added markup tokens are the family's markers."""
    path = tokenizer_dir(dst)
    words = [m for m in markers_of(FAMILIES[family]) if m not in TEXT_MARKERS][:4]
    tj = json.loads((path / "tokenizer.json").read_text())
    tc = json.loads((path / "tokenizer_config.json").read_text())
    for token, word in zip([t for t in tj["added_tokens"] if t["id"] >= 4092], words):
        token["content"] = word
        tc["added_tokens_decoder"][str(token["id"])]["content"] = word
    (path / "tokenizer.json").write_text(json.dumps(tj))
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    return _load(path), words


def _walk(grammars, tokenizer, grammar, text) -> bool:
    c = grammars.matcher(grammar)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return all(c.accept(t) for t in ids) and c.accept(STOP)


@pytest.fixture(scope="module")
def embedded():
    from tests.tokenizers import ASSETS

    tokenizer = _load(ASSETS)
    return tokenizer, Grammars(tokenizer, VOCAB, {STOP})


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("spelling", ["text", "tokens"])
def test_the_family_s_own_call_is_held(family, spelling, embedded, tmp_path):
    if spelling == "text":
        tokenizer, grammars = embedded
    else:
        tokenizer, words = _family_tokenizer(tmp_path, family)
        assert all(len(tokenizer.encode(w, add_special_tokens=False)) == 1 for w in words)
        grammars = Grammars(tokenizer, VOCAB, {STOP})
    markers = token_markers(tokenizer)

    def grammar(choice, name="", fmt=family, **kw):
        return tool_grammar(
            [WEATHER, SEARCH], choice, name, output_format=fmt, markers=markers, **kw
        )

    required, auto = grammar("required"), grammar("auto")
    named, other = grammar("function", "get_weather"), grammar("function", "search")
    for text in WRITTEN[family]:
        assert calls(family, text, SCHEMAS) == [("get_weather", {"city": "Paris", "unit": "c"})]
        assert _walk(grammars, tokenizer, required, text), text
        assert _walk(grammars, tokenizer, named, text) and not _walk(
            grammars, tokenizer, other, text
        )
        assert not _walk(grammars, tokenizer, required, text.replace("Paris", "P" * 13))
        bad = text.replace(ARGS, BAD).replace('"unit": "c"', '"unit": "k"')
        bad = bad.replace('unit="c"', 'unit="k"').replace(f"{Q}c{Q}", f"{Q}k{Q}")
        bad = bad.replace("\nc\n", "\nk\n").replace(">c<", ">k<").replace(">c]", ">k]")
        assert bad != text and not _walk(grammars, tokenizer, required, bad), bad
        assert _walk(grammars, tokenizer, auto, text)
        if family not in ONE:
            two = _two(family, text)
            assert len(calls(family, two, SCHEMAS)) == 2, two
            assert _walk(grammars, tokenizer, required, two) and _walk(
                grammars, tokenizer, auto, two
            )
            single = grammar("required", parallel=False)
            assert _walk(grammars, tokenizer, single, text)
            assert not _walk(grammars, tokenizer, single, two), two
            assert not _walk(grammars, tokenizer, named, two), two  # one named call
        if FAMILIES[family].think_open:  # a reasoning block the model opens itself
            markup = FAMILIES[family]
            plan = f"{markup.think_open}{markup.think_name}Weather first.{markup.think_close}"
            assert _walk(grammars, tokenizer, required, plan + text)
            # the bridge reads what the grammar allows there as reasoning, never as text
            parser = make_parser(family, tools=[WEATHER, SEARCH])
            said, thought, _ = joined(parser.feed(plan + text) + parser.close())
            assert (said, thought.strip()) == ("", "Weather first."), (said, thought)
            off = grammar("required", reasoning=False)  # the client switched it off
            assert _walk(grammars, tokenizer, off, text)
            assert not _walk(grammars, tokenizer, off, plan + text)
            if markup.think_name:  # another block name is not the model's reasoning
                other = f"{markup.think_open}code{markup.think_close}"
                assert not _walk(grammars, tokenizer, required, other + text)
        if family not in LEADING:  # a call may follow text
            assert _walk(grammars, tokenizer, auto, "Let me see.\n" + text)
            assert not _walk(grammars, tokenizer, auto, "Let me see.\n" + bad)
            assert _walk(grammars, tokenizer, grammar("none"), "Let me see.\n")
            assert not _walk(grammars, tokenizer, required, "Let me see.\n" + text)
        if family != "harmony":
            think = FAMILIES[family].think_close
            thinking = grammar("required", fmt=f"{family}-thinking")
            assert _walk(grammars, tokenizer, thinking, f"Hm, weather.{think}{text}")
            assert not _walk(grammars, tokenizer, thinking, text)
            # reasoning switched off: the generation prompt closed the block already
            closed = grammar("required", fmt=f"{family}-thinking", reasoning=False)
            assert _walk(grammars, tokenizer, closed, text)
    if family in ("llama3_json", "pythonic"):  # text, but never a call opening the output
        assert _walk(grammars, tokenizer, grammar("none"), "See [1] and {2}.")
        assert not _walk(grammars, tokenizer, grammar("none"), WRITTEN[family][0])
    answer = "The weather is fine."
    if family == "harmony":  # every harmony message names its channel
        answer = "<|channel|>final<|message|>" + answer
    if family == "solar_open":  # and every Solar Open message its kind
        answer = "<|content|>" + answer
    if family == "atem":  # every message names its recipient
        answer = " to=user<|message|>" + answer
    if family == "functionary_v3_2":  # a message to all
        answer = "all\n" + answer
    if family == "kimi_k3":  # the text is the response block
        answer = f"<|open|>response<|sep|>{answer}<|close|>response<|sep|>"
    assert _walk(grammars, tokenizer, auto, answer)


def _parsed(family: str, text: str) -> list[tuple[str, dict]]:
    """The calls the bridge's own parser reads from `text`, fed whole and then in pieces of
    three characters: what a client of that family would get back."""
    got = []
    for size in (len(text) or 1, 3):
        parser = make_parser(family, tools=[WEATHER, SEARCH])
        parts = [q for i in range(0, len(text), size) for q in parser.feed(text[i : i + size])]
        _, _, read = joined(parts + parser.close())
        got.append([(start.name, _stripped(end.arguments)) for start, end in read])
    assert got[0] == got[1], got
    return got[0]


def _stripped(args: dict) -> dict:
    """String values without the whitespace around them (markup layout, not the value)."""
    return {k: v.strip() if isinstance(v, str) else v for k, v in args.items()}


def test_the_bridge_reads_every_family_s_markup_as_the_grammar_writes_it():
    """The grammar and the parser agree on each family's markup: what the grammar holds a
    model to is what the bridge gives its client as calls."""
    for family, texts in WRITTEN.items():
        for text in texts:
            assert _parsed(family, text) == [("get_weather", {"city": "Paris", "unit": "c"})]
            if family not in ONE:
                assert len(_parsed(family, _two(family, text))) == 2, family


def test_a_family_without_call_markup_refuses_required_naming_it():
    for choice, name in (("required", ""), ("function", "search")):
        with pytest.raises(GrammarError, match="output format 'plain'"):
            tool_grammar([WEATHER, SEARCH], choice, name, output_format="plain")
    assert tool_grammar([WEATHER], "auto", output_format="plain") is None


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_required_and_named_calls_in_the_batch_read_back_valid(family, tiny_loop, tiny_tokenizer):
    """One call (`parallel` off, or a named tool) must close. Garbage may run on until
    max_tokens where the grammar lets it: with parallel calls on (more calls), and in a
    reasoning block
    the family opens itself (Gemma's thought channel, harmony's analysis...). What
    closes reads back as valid calls, and at least two outputs of each family close."""
    markup = FAMILIES[family]
    own = {"harmony": "<|channel|>analysis", "solar_open": "<|think|>"}
    reasons = markup.think_open or own.get(family, "")
    reasons = reasons or OWN_REASONING.get(family, "")
    markers = token_markers(tiny_tokenizer)
    runs = [("required", "", False), ("function", "search", True), ("required", "", True)]
    closed = 0
    for seed in range(30 if reasons else 3):  # a reasoning run closes about half the time
        choice, name, parallel = runs[seed % 3]
        grammar = tool_grammar(
            [WEATHER, SEARCH],
            choice,
            name,
            parallel=parallel,
            output_format=family,
            markers=markers,
        )
        ids, final = run(tiny_loop, [25, 36, 48 + seed], grammar, seed=seed, max_tokens=400)
        text = tiny_tokenizer.decode(ids)
        many = parallel and choice == "required"
        if final.finish_reason == FinishReason.LENGTH:
            if many or (reasons and text.startswith(reasons)):
                continue
        assert final.finish_reason == FinishReason.STOP and not final.incomplete, text
        read = calls(family, text, SCHEMAS)
        assert read and (many or len(read) == 1), text
        for tool, args in read:
            assert not name or tool == name, text
            jsonschema.validate(args, SCHEMAS[tool])
        assert _parsed(family, text) == [(t, _stripped(a)) for t, a in read], text
        closed += 1
        if closed == 2 and reasons:
            break
    assert closed >= 2
