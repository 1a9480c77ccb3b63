"""Reasoning and tool calls in a model's own output text, per model family, as typed parts.

A model writes its reasoning and its tool calls as markup inside the completion,
each family its own way. `make_parser(family)` returns an `OutputParser`: fed the
completion's text as it streams, it answers frozen parts (`TextPart`,
`ReasoningPart`, `ToolCallStart`, `ToolCallDelta`, `ToolCallEnd`) that the wire
formats turn into their own fields. Markup never reaches a TextPart: a marker
split across feeds at any position is held back until it is whole, or until the
output ends and shows it was text after all.

Families (`ModelInfo.output_format`, which the engine decides at load from the
chat template and the tokenizer; engine.server.prompts.output_format):

- `qwen`: `<think>…</think>`, and `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`
  (Qwen, Hermes-style models, the embedded model);
- `glm`: `<think>…</think>`, and
  `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`;
- `qwen_xml`: `<think>…</think>`, and `<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n
  </parameter>…</function>\\n</tool_call>` (Qwen3-Coder, Qwen3-Coder-Next);
- `kimi`: `<think>…</think>`, and `<|tool_calls_section_begin|>` around calls
  `<|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>{…}<|tool_call_end|>`;
- `deepseek`: `<think>…</think>`, and `<｜tool▁calls▁begin｜>` around calls
  `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>` (V3.1), or
  `function<｜tool▁sep｜>NAME` and a ```json fence (V3, the R1 distills);
- `dsml`: `<think>…</think>`, and `<｜DSML｜function_calls>` around calls
  `<｜DSML｜invoke name="NAME"><｜DSML｜parameter name="K" string="true|false">V
  </｜DSML｜parameter></｜DSML｜invoke>` (DeepSeek-V3.2; V4 names the section `tool_calls`);
- `llama3_json`: `{"name": …, "parameters": {…}}` (several by `;`) at the output's start
  or after `<|python_tag|>` (Llama 3.1, 3.2, 3.3);
- `pythonic`: `[NAME(k=v, …), …]` at the output's start or inside
  `<|python_start|>…<|python_end|>` (Llama 4);
- `mistral`: `[THINK]…[/THINK]`, and `[TOOL_CALLS]` then a JSON list or `NAME[ARGS]{…}`
  (`[CALL_ID]ID` may precede `[ARGS]`), one per `[TOOL_CALLS]`, to the output's end;
- `harmony` (gpt-oss): the `analysis` channel is reasoning, `final` text, and a call
  `to=functions.NAME … <|message|>{…}<|call|>`; the message headers are dropped;
- `gemma4`: `<|channel>thought…<channel|>`, and
  `<|tool_call>call:NAME{k:<|"|>v<|"|>,…}<tool_call|>`;
- `command_r`: `Action:` then a ```json fenced list of `{"tool_name", "parameters"}`;
- `command_r7b`: `<|START_THINKING|>…<|END_THINKING|>`, and the same list in
  `<|START_ACTION|>…<|END_ACTION|>` (`<|START_RESPONSE|>` is dropped);
- `minimax`: `<think>…</think>`, and `<minimax:tool_call>` around
  `<invoke name="NAME"><parameter name="K">V</parameter></invoke>` calls;
- `nemotron`: `<think>…</think>`, and `<TOOLCALL>[{"name", "arguments"}, …]</TOOLCALL>`;
- `granite`: `<think>…</think>`, and `<|tool_call|>[…]` to the output's end;
- `phi4`: `functools[…]` to the output's end (Phi-4 mini);
- `apertus`: `<|inner_prefix|>…<|inner_suffix|>`, and
  `<|tools_prefix|>[{"NAME": {…}}, …]<|tools_suffix|>`;
- `apriel`: `Here are my reasoning steps:` … `[BEGIN FINAL RESPONSE]` (Apriel 1.6's
  generation prompt opens it: `apriel-thinking`), and `<tool_calls>[{"name", "arguments"},
  …]</tool_calls>`; `[END FINAL RESPONSE]` is dropped;
- `seed_oss`: `<seed:think>…</seed:think>`, and `<seed:tool_call>\\n<function=NAME>\\n
  <parameter=K>V</parameter>…</function>\\n</seed:tool_call>`;
- `gigachat3`: the text, `<|message_sep|>`, then a `function call<|role_sep|>` message
  holding `{"name": …, "arguments": {…}}`; `gigachat3_1`: the same object after
  `<|function_call|>`; a message ends at `<|message_sep|>`;
- `lfm2`: `<think>…</think>`, and `<|tool_call_start|>[NAME(k=v), …]<|tool_call_end|>`
  (LFM2.5; LFM2's JSON list reads too);
- `solar_open`: `<|think|>…<|end|>`, and `<|tool_calls|>` around calls
  `<|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{…}<|tool_call:end|>`
  up to `<|calls|>` (a call keeps its ID); the message headers are dropped;
- calls written as tags (clients.bridge.tag_calls has their readers and streamers):
  `kimi_k3` (`<|open|>think<|sep|>…`, then `<|open|>tools<|sep|>` around
  `<|open|>call tool="NAME" …<|sep|>` calls), `minimax_m1` (`<think>`, JSON lines in
  `<tool_calls>`), `minimax_m3` (`<mm:think>`, `]<]minimax[>[<tool_call>` around invokes),
  `atem` (Muse Glimmer: ` to=self<|message|>` reasoning, a call a ` to=NAME<|message|>`
  message of `<atem:function_calls>`), `minicpm` (`<think>`, `<function name="NAME">`
  calls of `<param name="K">` values), `hy3` (`<think:opensource>`, `<tool_calls:opensource>`
  around `<tool_call:opensource>NAME<tool_sep:opensource>` and `<arg_key:…>` pairs);
- `functionary_v3_1`: `<function=NAME>{…}</function>` (MeetKai's on Llama 3.1), and
  `<|python_tag|>` then the code of a call to the request's `python` tool, to the
  output's end;
- `functionary_v3_2`: messages after `>>>` (the generation prompt ends with the first):
  `all\\n` then text, or `NAME\\n{…}` a call;
- `plain`: no markup: everything is text.

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

import re
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence, Union

from clients.bridge import body_streams as lists
from clients.bridge import call_bodies as bodies
from clients.bridge import call_bodies_tagged as tagged
from clients.bridge import call_streams as streams
from clients.bridge import tag_calls as tags
from clients.bridge.calls import (
    DSML,
    Call,
    new_call_id,
    parse_deepseek_call,
    parse_dsml_call,
    parse_glm_call,
    parse_kimi_call,
    parse_qwen_call,
    parse_xml_call,
)
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


# A call's body (the text between its markers) -> its Call(s), or None when malformed.
CallParser = Callable[[str, Sequence[Mapping] | None], Union[Call, list[Call], None]]


def _calls(read: Callable) -> CallParser:
    """A clients.bridge.call_bodies reader as a CallParser (each call its own id)."""

    def parse(body: str, tools=None) -> list[Call] | None:
        found = read(body, tools)
        return found and [Call(n, a, t, new_call_id()) for n, a, t in found]

    return parse


@dataclass(frozen=True)
class Markup:
    """How one family marks reasoning and tool calls."""

    think: tuple[str, str] | None
    call: tuple[str, str | None] | None  # closer None: the call runs to the output's end
    parse: CallParser | None = None
    section: tuple[str, str] | None = None  # a wrapper around a run of calls (kimi)
    drop: tuple[str, ...] = ()  # more markup between the parts (harmony's headers)
    lead: str = ""  # characters that open a call when the output starts with one
    stream: streams.Streamer | None = None  # what of an open call is settled; None: whole
    # the call's opener counts only at the output's start or right after one of these
    # (atem's ` to=` opens a call in a message's header, not in its text)
    call_at: tuple[str, ...] | None = None
    # the generation prompt ends with this markup, so the output continues it (functionary
    # v3.2's `>>>`); the closer is the next message's opener too (given back, not eaten)
    prompt_tail: str = ""
    closer_opens: bool = False
    # a marker after which the rest of the output is one call written another way, with
    # its own reader and streamer (functionary v3.1's `<|python_tag|>` code)
    code_call: tuple[str, CallParser, streams.Streamer] | None = None


THINK = ("<think>", "</think>")
APRIEL_THINK = ("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]")
# gpt-oss's message headers around the channels (`<|start|>assistant<|channel|>final...`).
HARMONY_HEADERS = (
    "<|start|>assistant",
    "<|channel|>final<|message|>",
    "<|channel|>commentary",
    "<|message|>",
    "<|return|>",
    "<|call|>",
)
# Kimi K3's message and response tags around the reasoning, the text and the calls.
K3_DROP = (
    "<|open|>response<|sep|>",
    "<|close|>response<|sep|>",
    "<|close|>message<|sep|>",
    "<|end_of_msg|>",
)
MARKUPS: dict[str, Markup] = {
    "qwen": Markup(THINK, ("<tool_call>", "</tool_call>"), parse_qwen_call, stream=streams.qwen),
    "qwen_xml": Markup(
        THINK, ("<tool_call>", "</tool_call>"), parse_xml_call, stream=streams.qwen_xml
    ),
    "glm": Markup(THINK, ("<tool_call>", "</tool_call>"), parse_glm_call, stream=streams.glm),
    "kimi": Markup(
        THINK,
        ("<|tool_call_begin|>", "<|tool_call_end|>"),
        parse_kimi_call,
        section=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
        stream=streams.kimi,
    ),
    "deepseek": Markup(
        THINK,
        ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
        parse_deepseek_call,
        section=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
        stream=streams.deepseek,
    ),
    "dsml": Markup(
        THINK,
        (f'<{DSML}invoke name="', f"</{DSML}invoke>"),
        parse_dsml_call,
        section=(f"<{DSML}function_calls>", f"</{DSML}function_calls>"),
        drop=(f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"),  # DeepSeek-V4's section
        stream=streams.dsml,
    ),
    "llama3_json": Markup(
        None,
        ("<|python_tag|>", None),
        _calls(bodies.llama3_objects),
        lead="{",
        stream=lists.llama3_calls,
    ),
    "pythonic": Markup(
        None,
        ("<|python_start|>", "<|python_end|>"),
        _calls(bodies.pythonic_calls),
        lead="[",
        stream=lists.pythonic,
    ),
    "mistral": Markup(
        ("[THINK]", "[/THINK]"),
        ("[TOOL_CALLS]", None),
        _calls(bodies.mistral_calls),
        stream=lists.mistral,
    ),
    "harmony": Markup(
        ("<|channel|>analysis<|message|>", "<|end|>"),
        ("to=functions.", "<|call|>"),
        _calls(bodies.harmony_call),
        drop=HARMONY_HEADERS,
        stream=streams.harmony,
    ),
    "gemma4": Markup(
        ("<|channel>thought", "<channel|>"),
        ("<|tool_call>", "<tool_call|>"),
        _calls(bodies.gemma_call),
        stream=lists.gemma,
    ),
    "command_r": Markup(
        None, ("Action:", None), _calls(bodies.cohere_list), stream=lists.cohere_calls
    ),
    "command_r7b": Markup(
        ("<|START_THINKING|>", "<|END_THINKING|>"),
        ("<|START_ACTION|>", "<|END_ACTION|>"),
        _calls(bodies.cohere_list),
        drop=("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
        stream=lists.cohere_calls,
    ),
    "minimax": Markup(
        THINK,
        ("<minimax:tool_call>", "</minimax:tool_call>"),
        _calls(bodies.minimax_invokes),
        stream=streams.minimax,
    ),
    "nemotron": Markup(
        THINK, ("<TOOLCALL>", "</TOOLCALL>"), _calls(bodies.json_list), stream=lists.json_calls
    ),
    "granite": Markup(
        THINK,
        ("<|tool_call|>", None),
        _calls(bodies.json_list),
        drop=("<response>", "</response>"),
        stream=lists.json_calls,
    ),
    "phi4": Markup(None, ("functools", None), _calls(bodies.json_list), stream=lists.json_calls),
    # the families of clients.bridge.call_bodies_tagged
    "apertus": Markup(
        ("<|inner_prefix|>", "<|inner_suffix|>"),
        ("<|tools_prefix|>", "<|tools_suffix|>"),
        _calls(tagged.apertus_calls),
        stream=tagged.apertus,
    ),
    "apriel": Markup(
        APRIEL_THINK,
        ("<tool_calls>", "</tool_calls>"),
        _calls(tagged.apriel_calls),
        drop=("[END FINAL RESPONSE]",),
        stream=tagged.apriel,
    ),
    "seed_oss": Markup(
        ("<seed:think>", "</seed:think>"),
        ("<seed:tool_call>", "</seed:tool_call>"),
        _calls(tagged.seed_call),
        stream=tagged.seed,
    ),
    "gigachat3": Markup(
        None, ("function call<|role_sep|>", "<|message_sep|>"), parse_qwen_call, stream=streams.qwen
    ),
    "gigachat3_1": Markup(
        None, ("<|function_call|>", "<|message_sep|>"), parse_qwen_call, stream=streams.qwen
    ),
    "lfm2": Markup(
        THINK,
        ("<|tool_call_start|>", "<|tool_call_end|>"),
        _calls(tagged.lfm2_calls),
        stream=lists.pythonic_or_json,
    ),
    "solar_open": Markup(
        ("<|think|>", "<|end|>"),
        ("<|tool_call:begin|>", "<|tool_call:end|>"),
        tagged.solar_call,
        section=("<|tool_calls|>", "<|calls|>"),
        drop=("<|begin|>assistant", "<|content|>", "<|flush|>"),
        stream=tagged.solar,
    ),
    # -- calls written as tags (clients.bridge.tag_calls) --
    "kimi_k3": Markup(
        ("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
        ('<|open|>call tool="', "<|close|>call<|sep|>"),
        _calls(tags.kimi_k3),
        section=("<|open|>tools<|sep|>", "<|close|>tools<|sep|>"),
        drop=K3_DROP,
        stream=tags.stream_kimi_k3,
    ),
    "minimax_m1": Markup(
        THINK,
        ("<tool_calls>", "</tool_calls>"),
        _calls(tags.minimax_m1),
        stream=tags.stream_minimax_m1,
    ),
    "minimax_m3": Markup(
        ("<mm:think>", "</mm:think>"),
        (f"{tags.M3_NS}<tool_call>", f"{tags.M3_NS}</tool_call>"),
        _calls(tags.minimax_m3),
        stream=tags.stream_minimax_m3,
    ),
    "atem": Markup(
        (" to=self<|message|>", "<|eom|>"),
        (" to=", "</atem:function_calls>"),
        _calls(tags.atem),
        drop=("<|start|>assistant", " to=user<|message|>", "<|eot|>"),
        stream=tags.stream_atem,
        call_at=("<|start|>assistant",),
    ),
    "minicpm": Markup(
        THINK, ('<function name="', "</function>"), _calls(tags.minicpm), stream=tags.stream_minicpm
    ),
    "hy3": Markup(
        (f"<think{tags.HY}>", f"</think{tags.HY}>"),
        (f"<tool_call{tags.HY}>", f"</tool_call{tags.HY}>"),
        _calls(tags.hy3),
        section=(f"<tool_calls{tags.HY}>", f"</tool_calls{tags.HY}>"),
        stream=tags.stream_hy3,
    ),
    "functionary_v3_1": Markup(
        None,
        ("<function=", "</function>"),
        _calls(tags.functionary_v3_1),
        stream=tags.stream_functionary_v3_1,
        code_call=("<|python_tag|>", _calls(tags.python_code), tags.stream_python_code),
    ),
    "functionary_v3_2": Markup(
        None,
        (">>>", ">>>"),
        _calls(tags.functionary_v3_2),
        drop=(">>>all\n",),
        stream=tags.stream_functionary_v3_2,
        prompt_tail=">>>",
        closer_opens=True,
    ),
    "plain": Markup(None, None),
}

_TEXT, _REASONING, _SECTION, _CALL = "text", "reasoning", "section", "call"
_NAME_FIRST = re.compile(r"[\w.-]*\w(\n|$)")  # a call after the prompt's tail: its name first


class OutputParser:
    """A completion's text, fed as it streams, as parts (see the module docstring).

    Invariant: with no markup in the text, the TextParts of every feed plus
    close() join to exactly the text fed, however it was split.
    """

    def __init__(self, markup: Markup, reasoning: bool = False, tools=None):
        self.markup = markup
        self.tools = tools
        self.state = _REASONING if reasoning and markup.think else _TEXT
        self.held = markup.prompt_tail  # fed text not handled yet: it may end with part of a marker
        self.space = ""  # whitespace at the end of the text or reasoning, held
        self.lead = self.call_lead = ""  # the whitespace before the last marker, the call's
        self.strip = self.state == _REASONING  # drop leading whitespace (after a marker)
        self.opened = reasoning  # the template opened the reasoning: a leading <think> repeats it
        self.in_section = False
        self.opener = ""  # the open call's marker
        self.shown = ""  # what of it the model wrote ("" for the generation prompt's tail)
        self.tail = markup.prompt_tail  # the generation prompt's tail, not yet acted on
        self.body = ""  # the open call's text
        self.index = 0  # calls that parsed
        self.streamed = streams.Streamed()  # the open call's calls that went out
        self.at_start = bool(markup.lead) and self.state == _TEXT  # a lead may open a call
        self.at_message = True  # at the output's start or after a call_at marker
        self.closing = False

    def feed(self, text: str) -> list[Part]:
        self.held += text
        out: list[Part] = []
        while self._step(out):
            pass
        return _merged(out)

    def close(self) -> list[Part]:
        """The parts the end of the output settles: held text, an unterminated call."""
        out: list[Part] = []
        self.closing = True  # a marker that a longer one may have continued is whole now
        while self._step(out):
            pass
        rest, self.held = self.held, ""
        if self.state == _CALL:
            self.body += rest
            # a call its marker opened and the output's end cut (max_tokens, a stop string)
            # is markup, not text: when it does not parse it is dropped (raw ""); a call
            # that opened without a marker (a lead) was text after all; one the prompt's
            # tail opened is cut where it began like a call (a name), else it was text
            cut = bool(self.shown) or (
                self.opener != self.shown and _NAME_FIRST.match(self.body) is not None
            )
            self._end_call(out, "" if cut else self.shown + self.body, keep_lead=not cut)
        elif self.state == _SECTION:
            pass  # between calls: what is held is the start of a marker, not text
        elif self.state == _REASONING:
            self._content(rest, ReasoningPart, out)
        else:
            self._content(rest, TextPart, out)
            if self.state == _TEXT and self.space:
                out.append(TextPart(self.space))
        self.space = ""
        return _merged(out)

    # -- the state machine ---------------------------------------------------

    def _markers(self) -> dict[str, str]:
        """Marker -> what it does, in the current state."""
        m, out = self.markup, {}
        if self.state == _TEXT:
            if m.think:
                out[m.think[0]] = "think"
                out[m.think[1]] = "drop"  # a stray closer is markup too
            if m.call:
                if m.call_at is None or self.at_message:
                    out[m.call[0]] = "call"
                if m.call[1] and m.call[1] != m.call[0]:
                    out[m.call[1]] = "drop"
            if m.section:
                out[m.section[0]] = "section"
                out[m.section[1]] = "drop"
            for marker in m.drop:
                out.setdefault(marker, "drop")
            if m.code_call:
                out[m.code_call[0]] = "call"
        elif self.state == _REASONING:
            out[m.think[1]] = "text"
            if self.opened:
                out[m.think[0]] = "reopen"
        elif self.state == _SECTION:
            out[m.call[0]] = "call"
            out[m.section[1]] = "text"
        elif m.call[1] and not self._code():
            out[m.call[1]] = "end"
        return out

    def _code(self) -> bool:
        """Whether the open call is the family's code call (Markup.code_call)."""
        return (
            bool(self.opener)
            and self.markup.code_call is not None
            and (self.opener == self.markup.code_call[0])
        )

    def _step(self, out: list[Part]) -> bool:
        """Handle the held text up to the next marker; False when none is whole yet."""
        if self.at_start:
            return self._lead()
        markers = self._markers()
        found = [(self.held.find(k), -len(k), k) for k in markers]
        found = [f for f in found if f[0] >= 0]
        if not found:
            keep = _partial(self.held, markers)
            self._handle(self.held[: len(self.held) - keep], out)
            self.held = self.held[len(self.held) - keep :]
            return False
        at, _, marker = min(found)
        rest = self.held[at:]
        if not self.closing and any(len(k) > len(rest) and k.startswith(rest) for k in markers):
            # a longer marker (` to=self<|message|>` beside ` to=`) may still come whole
            self._handle(self.held[:at], out)
            self.held = rest
            return False
        self._handle(self.held[:at], out)
        self.held = self.held[at + len(marker) :]
        self._act(markers[marker], marker, out)
        return True

    def _lead(self) -> bool:
        """At the output's start, a call that opens without a marker (Llama 3's JSON,
        pythonic lists) or not; False while only whitespace has come."""
        rest = self.held.lstrip()
        if not rest:
            return False
        self.at_start = False
        if rest[0] in self.markup.lead:
            self.call_lead, self.held = self.held[: len(self.held) - len(rest)], rest
            self.state, self.opener, self.body, self.in_section = _CALL, "", "", False
        return True

    def _handle(self, text: str, out: list[Part]) -> None:
        if not text:
            return
        if self.state == _CALL:
            self.body += text
            self._stream(out)
        elif self.state == _REASONING:
            self.opened = self.opened and not text.strip()
            self._content(text, ReasoningPart, out)
        elif self.state == _SECTION:
            if text.strip():  # not markup, so it is text
                out.append(TextPart(text))
        else:
            self.at_message = self.at_message and not text.strip()
            self._content(text, TextPart, out)

    def _act(self, action: str, marker: str, out: list[Part]) -> None:
        # Whitespace beside markup is layout; before a call it is kept aside, the call's
        # if it does not parse (then its raw text is returned as it was written).
        self.lead, self.space = self.space, ""
        self.at_message = marker in (self.markup.call_at or ())
        tail, self.tail = self.tail, ""  # only the first marker can be the prompt's tail
        if action == "think":
            self.state, self.strip = _REASONING, True
        elif action == "call":
            self.in_section = self.state == _SECTION
            self.state, self.opener, self.body = _CALL, marker, ""
            self.shown = "" if tail == marker else marker
            self.call_lead = self.lead
        elif action == "section":
            self.state = _SECTION
        elif action == "end":
            reopen = self.markup.closer_opens  # the closer opens the next message too
            parsed = self._end_call(out, self.shown + self.body + ("" if reopen else marker))
            self.state = _SECTION if self.in_section else _TEXT
            if reopen:
                self.held = marker + self.held
            if not parsed:  # its text stands as written, the whitespace after it too
                self.strip = False
                return
        elif action == "text":
            self.state = _TEXT
        self.strip = True
        if action == "reopen":
            self.opened = False

    def _content(self, text: str, kind, out: list[Part]) -> None:
        """Text or reasoning, its leading whitespace dropped after a marker and its
        trailing whitespace held until more comes (markup may follow it)."""
        if self.strip:
            text = text.lstrip()
            if not text:
                return
            self.strip = False
        text = self.space + text
        body = text.rstrip()
        self.space = text[len(body) :]
        if body:
            out.append(kind(body))

    def _stream(self, out: list[Part]) -> None:
        """The open call's settled calls and arguments. A call its marker opened streams
        once its name is whole; one opened without a marker (a lead: it may yet be text)
        once its first call names a tool of the request."""
        stream = self.markup.code_call[2] if self._code() else self.markup.stream
        if stream is None:
            return
        known = stream(self.body, self.tools)
        if self.opener or self.streamed.calls or (known and known[0].name in self._names()):
            self.index = self.streamed.grow(known, self.index, out)

    def _names(self) -> set[str]:
        """The request's tool names."""
        fns = (t.get("function", t) for t in self.tools or () if isinstance(t, Mapping))
        return {f.get("name") for f in fns if isinstance(f, Mapping)}

    def _end_call(self, out: list[Part], raw: str, keep_lead: bool = True) -> bool:
        """The open call's parts; False when it does not parse and nothing of it was
        streamed (one ToolCallEnd, its raw text with the whitespace before it)."""
        parse = self.markup.code_call[1] if self._code() else self.markup.parse
        calls = parse(self.body, self.tools) if parse else None
        if isinstance(calls, Call):
            calls = [calls]
        if not calls and not self.streamed.calls:
            out.append(ToolCallEnd(self.index, None, self.call_lead + raw if keep_lead else raw))
            return False
        self.index = self.streamed.end(calls or [], raw or self.opener + self.body, self.index, out)
        return True


def _partial(text: str, markers) -> int:
    """Length of the longest end of `text` that begins one of `markers` (held back)."""
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


def _merged(parts: list[Part]) -> list[Part]:
    """Adjacent text parts joined, adjacent reasoning parts joined."""
    out: list[Part] = []
    for p in parts:
        if out and type(p) is type(out[-1]) and isinstance(p, (TextPart, ReasoningPart)):
            out[-1] = type(p)(out[-1].text + p.text)
        else:
            out.append(p)
    return out


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
