"""Reasoning and tool calls in a model's own output text, per model family, as typed parts.

A model writes its reasoning and its tool calls as markup inside the completion,
each family its own way. `make_parser(family)` returns an `OutputParser`: fed the
completion's text as it streams, it answers frozen parts (`TextPart`,
`ReasoningPart`, `ToolCallStart`, `ToolCallDelta`, `ToolCallEnd`) that the wire
formats turn into their own fields. Markup never reaches a TextPart: a marker
split across feeds at any position is held back until it is whole, or until the
output ends and shows it was text after all.


The families and their markup are clients.bridge.markups' table; the state machine
that reads a completion through one is clients.bridge.output_parser; this module is
the way in (`make_parser`) and the parts' contract:

A call with no marker (llama3_json, pythonic) opens only where the output starts
with its first character; if it streamed nothing (it named no tool of the request)
and does not parse at the end, it was text. A call whose marker opened it and that
the output's end cut (max_tokens, a stop string) before it parses is dropped: its
markup is not text.

A `-thinking` suffix (`qwen-thinking`, ...) says the template's generation
prompt opens the reasoning block itself, so the output starts inside it.

A tool call is ToolCallStart (index, id, name), ToolCallDeltas whose texts join to its
arguments' JSON text, then ToolCallEnd (its parsed arguments). Every family with calls has
a streamer (clients.bridge.call_streams, clients.bridge.body_streams,
clients.bridge.call_bodies_tagged,
clients.bridge.tag_calls): a call opened by
its marker starts once its name is whole and its arguments stream as they settle (JSON
text as written; a syntax that is not JSON, gemma4's or pythonic, as the JSON of each
argument once its value is whole). A call opened without a marker (llama3_json, pythonic
at the output's start), which may yet be text, streams once its first call names a tool
of the request; else it comes whole when the output ends. What was streamed cannot be
taken back: a streamed call whose markup then does not parse (or the output's end cuts)
still ends as a call, its arguments what it streamed (`arguments` None where that is no
JSON object), with a warning in the log, and none of its markup becomes text. A call that
streamed nothing and does not parse comes as a ToolCallEnd alone (no start), `arguments`
None and its `raw` markup, which the endpoint returns as text (with a warning in its
log). Indexes count the calls started, from 0. The arguments text is the model's own
where the format writes them as JSON (qwen, kimi, deepseek, mistral, harmony,
llama3_json, the JSON lists, apertus, apriel, gigachat3, solar_open), so a client that
sends it back re-renders the same tokens; else `json.dumps` of the arguments.
Whitespace that the markup's layout puts around reasoning and calls (the
newline after `<think>` or `</tool_call>`) is not text; text without markup
comes through unchanged.


Plain Python, no MLX: a client process imports it.
"""

from dataclasses import replace

from clients.bridge.markups import MARKUPS, Markup
from clients.bridge.output_parser import OutputParser
from clients.bridge.parts import (
    Part,
    ReasoningPart,
    TextPart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    joined,
)
from engine.config.prompt import OUTPUT_FAMILIES

# the parts are defined in clients.bridge.parts; the wire formats import them from here
__all__ = [
    "FAMILIES",
    "MARKUPS",
    "THINKING",
    "Markup",
    "OutputParser",
    "Part",
    "ReasoningPart",
    "TextPart",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "joined",
    "make_parser",
]

FAMILIES = OUTPUT_FAMILIES  # one list, declared with the setting that names them
THINKING = "-thinking"  # suffix: the output starts inside the reasoning block


def make_parser(family: str, *, tool_calls: bool = True, tools=None) -> OutputParser:
    """A parser for one completion of a model of `family` (see FAMILIES; `-thinking` may
    follow). `tool_calls` False leaves call markup as text (the request gave no tools);
    `tools` (OpenAI-style definitions) tell glm which values are strings.
    ValueError names an unknown family."""
    name = family.removesuffix(THINKING)
    if name not in MARKUPS:
        raise ValueError(
            f"output format {family!r} is not one of {', '.join(FAMILIES)} "
            f"(each may end in {THINKING})"
        )
    markup = MARKUPS[name]
    if not tool_calls:
        markup = replace(markup, call=None, parse=None, section=None, lead="", stream=None)
    return OutputParser(markup, reasoning=family.endswith(THINKING), tools=tools)
