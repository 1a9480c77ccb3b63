"""Each published chat template's own rendering of a past tool call, read back by the
parser the engine picks for that template, gives the same calls.

For every template of tests/templates/published.toml: the family the engine decides at
load (engine.server.prompts.output_format, from the template and the tokenizer's vocabulary) is
the manifest's. For each that writes tool calls: an assistant turn with a call (its
arguments as an object), rendered by the engine's own render path, is what a model of
that family was trained to write; the text after the generation prompt, cut at the
model's end of turn, is fed to the family's parser whole and streamed at the
tokenizer's token boundaries, and must give the same name and arguments; two calls in
one turn round-trip where the template writes both; the turn's text and reasoning land
in their fields and no markup reaches the text.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from clients.bridge.parsers import (
    MARKUPS,
    THINKING,
    ToolCallDelta,
    ToolCallStart,
    joined,
    make_parser,
)
from engine.server.prompts.output_format import output_format
from engine.server.prompts.renders import TemplateRenders
from tests.templates.published import manifest, published_text
from tests.tokenizers import ASSETS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "the city"},
                    "days": {"type": "integer", "description": "how many days"},
                },
                "required": ["city"],
            },
        },
    }
]
ASK = {"role": "user", "content": "What is the weather in Paris and in Rome?"}
CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Rome"})]
ANSWER = {"role": "tool", "tool_call_id": "call0abcd", "content": "Sunny."}
CONTENT = "Let me look that up."
REASONING = "The user wants two forecasts."
ENTRIES = manifest()
WRITES_CALLS = sorted(n for n, e in ENTRIES.items() if e["calls"] != "none")
PARALLEL = [n for n in WRITES_CALLS if ENTRIES[n]["calls"] == "parallel"]


def _call(i: int, name: str, args: dict) -> dict:
    # 9 alphanumeric characters: Mistral's templates refuse any other id
    return {"id": f"call{i}abcd", "type": "function", "function": {"name": name, "arguments": args}}


def turn(calls, content=None, reasoning=None) -> dict:
    message = {"role": "assistant", "content": content}
    message["tool_calls"] = [_call(i, n, a) for i, (n, a) in enumerate(calls)]
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


class Template:
    """One published template on the repository's tokenizer: its family and renders."""

    def __init__(self, name: str, calls: bool = False):
        self.name, self.entry = name, ENTRIES[name]
        if calls and "skip" in self.entry:
            pytest.skip(self.entry["skip"])
        if calls and "unread" in self.entry:
            pytest.skip(f"writes {self.entry['unread']}, which no family reads")
        self.tokenizer = AutoTokenizer.from_pretrained(ASSETS)
        self.tokenizer.chat_template = published_text(name)
        if "bos_token" in self.entry:  # the model's own; the tests' tokenizer has none
            self.tokenizer.bos_token = self.entry["bos_token"]
        self.renders = TemplateRenders(self.tokenizer)
        self.family = output_format(
            "auto", self.tokenizer, lambda m: self.renders.analysis("probe", m, None, True)
        )

    def output(self, message: dict, after: tuple = ()) -> str:
        """What the model writes for `message`: its render after the generation prompt, or
        after the assistant turn's own header (where a turn of plain text renders the
        same) where that comes first, up to the first stop. `after`: the messages that
        follow it (a past turn, where the template writes the last turn otherwise)."""
        whole = self.renders.render([ASK, message, *after], TOOLS, False)
        plain = {"role": "assistant", "content": "\u2460"}
        other = self.renders.render([ASK, plain, *after], TOOLS, False)
        at = 0
        while at < min(len(other), len(whole)) and other[at] == whole[at]:
            at += 1
        at = markup_start(whole, at)
        prompt = self.renders.render([ASK], TOOLS, True)
        if whole.startswith(prompt):  # what follows the generation prompt is the model's
            at = min(at, len(prompt))
        think = MARKUPS[self.family.removesuffix(THINKING)].think
        if think and not self.family.endswith(THINKING) and whole[:at].rstrip().endswith(think[0]):
            at = whole.rindex(think[0], 0, at)  # the model opens its reasoning itself
        out = whole[at:]
        for stop in [*self.entry.get("stop", ()), self.tokenizer.eos_token]:
            out = out.split(stop)[0]
        if self.family.endswith(THINKING) and think and think[1] not in out:
            # the template dropped the turn's reasoning: the model closes its own first
            out = f"{REASONING}{think[1]}\n\n{out}"
        return out


def markup_start(text: str, at: int) -> int:
    """`at`, or the start of the marker it falls inside (`<...>`, `[...]`)."""
    for opener, closer in (("<", ">"), ("[", "]")):
        start = text.rfind(opener, 0, at)
        if start >= 0 and closer not in text[start:at]:
            return start
    return at


def token_pieces(tokenizer, text: str) -> list[str]:
    """`text` cut at its tokens' boundaries (as the engine streams it)."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    cuts = sorted({0, len(text), *(e for _, e in offsets["offset_mapping"])})
    return [text[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


def parsed(family: str, pieces) -> tuple[str, str, list]:
    parser = make_parser(family, tools=TOOLS)
    parts = [p for piece in pieces for p in parser.feed(piece)] + parser.close()
    text, reasoning, calls = joined(parts)
    return text, reasoning, [(s.name, e.arguments) for s, e in calls]


def round_trip(template: Template, message: dict, after: tuple = ()) -> tuple[str, list[tuple]]:
    """(the model's output, [(text, reasoning, calls)] whole and streamed by tokens)."""
    out = template.output(message, after)
    whole = parsed(template.family, [out])
    streamed = parsed(template.family, token_pieces(template.tokenizer, out))
    return out, [whole, streamed]


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_the_engine_picks_the_manifests_family(name):
    assert Template(name).family == ENTRIES[name]["family"]


@pytest.mark.parametrize("name", WRITES_CALLS)
def test_a_past_call_is_read_back_as_the_same_call(name):
    template = Template(name, calls=True)
    out, results = round_trip(template, turn(CALLS[:1]))
    for text, _, calls in results:
        assert calls == CALLS[:1], f"{template.family} did not read back {out!r}"
        assert text == "", f"markup reached the text: {text!r} (of {out!r})"


@pytest.mark.parametrize("name", WRITES_CALLS)
def test_a_past_call_streams_before_the_output_ends(name):
    """Fed at the tokenizer's token boundaries, the call starts and its arguments come in
    pieces before the output's last token: no family holds a call back to its end."""
    template = Template(name, calls=True)
    pieces = token_pieces(template.tokenizer, template.output(turn(CALLS[:1])))
    parser, fed = make_parser(template.family, tools=TOOLS), []
    for piece in pieces[:-1]:
        fed += parser.feed(piece)
    assert any(isinstance(p, ToolCallStart) for p in fed), f"no call before {pieces[-1]!r}"
    assert len([p for p in fed if isinstance(p, ToolCallDelta)]) > 1, "the arguments came whole"


@pytest.mark.parametrize("name", PARALLEL)
def test_two_calls_in_one_turn_are_read_back_in_order(name):
    template = Template(name, calls=True)
    out, results = round_trip(template, turn(CALLS))
    for text, _, calls in results:
        assert calls == CALLS, f"{template.family} did not read back {out!r}"
        assert text == "", f"markup reached the text: {text!r} (of {out!r})"


@pytest.mark.parametrize("name", WRITES_CALLS)
def test_the_turns_text_and_reasoning_land_in_their_fields(name):
    """What the template shows of the turn's content and reasoning comes back in the
    field the wire formats give it (gpt-oss writes a call turn's content on its analysis
    channel: reasoning), the call beside them. The turn is rendered as the engine renders
    a request (Kimi K2's list changes in its own sandbox, firefunction's `functions` as
    llama.cpp gives it, gpt-oss's turn without the reasoning it refuses beside text): a
    render that fails here fails that model's requests."""
    template = Template(name, calls=True)
    message = turn(CALLS[:1], CONTENT, REASONING)
    out, results = round_trip(template, message)
    if "get_weather" not in out:
        # Nemotron Nano v2 writes a last turn's content and calls as two turns, and a
        # past one (its call answered) as one: what the model was trained to write
        out, results = round_trip(template, message, (ANSWER,))
    if "get_weather" not in out:
        pytest.skip(  # DeepSeek-R1's (`content is none`) and llama.cpp's (`not content`)
            "the template writes a call turn's calls only where the turn has no text: "
            "its content or its calls, not both"
        )
    into = template.entry.get("content_field", "text")
    for text, reasoning, calls in results:
        assert calls == CALLS[:1], f"{template.family} did not read back {out!r}"
        fields = {"text": text, "reasoning": reasoning}
        expected = {"text": "", "reasoning": ""}
        if REASONING in out:
            expected["reasoning"] = REASONING
        if CONTENT in out:
            expected[into] = (expected[into] + "\n\n" + CONTENT).strip()
        for field in fields:
            got = fields[field].strip()
            assert got == expected[field] or set(got.split()) == set(expected[field].split()), (
                f"{field}: {got!r}, not {expected[field]!r} (of {out!r})"
            )


def test_functionary_v3_1s_code_call_is_read_back():
    """Functionary v3.1 writes a call of the request's `python` tool after `<|python_tag|>`
    (as Llama 3.1 does), not as `<function=`: the template's own rendering of one is read
    back as that call, whole and streamed."""
    template = Template("meetkai-functionary-medium-v3.1.jinja")
    code = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
    python = {"name": "python", "description": "Runs Python code", "parameters": code}
    tools = [*TOOLS, {"type": "function", "function": python}]
    call = ("python", {"code": "import math\nprint(math.pi)"})
    prompt = template.renders.render([ASK], tools, True)
    whole = template.renders.render([ASK, turn([call])], tools, False)
    assert whole.startswith(prompt)
    out = whole[len(prompt) :].split("<|eom_id|>")[0]
    assert out.startswith("<|python_tag|>"), out
    for pieces in ([out], token_pieces(template.tokenizer, out)):
        parser = make_parser(template.family, tools=tools)
        parts = [p for piece in pieces for p in parser.feed(piece)] + parser.close()
        text, _, calls = joined(parts)
        assert [(s.name, e.arguments) for s, e in calls] == [call] and text == "", out


def test_the_round_trip_fails_without_the_familys_parser(monkeypatch):
    """The round trip is the parser's: with Llama 3's taken out (its markup plain text),
    the published Llama 3.1 template's call comes back as text."""
    import clients.bridge.parsers as parsers

    template = Template("meta-llama-Llama-3.1-8B-Instruct.jinja")
    monkeypatch.setitem(parsers.MARKUPS, "llama3_json", parsers.MARKUPS["plain"])
    out, results = round_trip(template, turn(CALLS[:1]))
    for text, _, calls in results:
        assert calls == [] and json.loads(text)["name"] == "get_weather", out


@pytest.mark.parametrize("name", WRITES_CALLS)
def test_each_round_trip_is_its_familys_parser(name, monkeypatch):
    """With the family's markup read as plain text, no template's call comes back as a
    call: every round trip above rests on its family's own parser."""
    import clients.bridge.parsers as parsers

    template = Template(name, calls=True)
    family = template.family.removesuffix(THINKING)
    monkeypatch.setitem(parsers.MARKUPS, family, parsers.MARKUPS["plain"])
    out, results = round_trip(template, turn(CALLS[:1]))
    for text, _, calls in results:
        assert calls == [] and "get_weather" in text, out


def test_the_docs_table_is_the_manifests():
    """docs/api.md lists every published template with its family and round trip as the
    manifest says (`python -m tests.templates.published` prints the table to paste)."""
    from tests.templates.published import ROOT, TABLE_BEGIN, TABLE_END, docs_table

    page = (ROOT / "docs" / "api.md").read_text()
    assert f"{TABLE_BEGIN}\n{docs_table()}\n{TABLE_END}" in page, (
        "docs/api.md's published templates table is not the manifest's: "
        "paste the output of `python -m tests.templates.published` over it"
    )
