"""How each model family marks reasoning and tool calls in its output: `Markup`, and
`MARKUPS`, the table of every family's markers, call readers and call streamers.

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


It knows each family's markers and which reader and streamer read its call bodies
(clients.bridge.calls, call_bodies, call_bodies_tagged, tag_calls, call_streams,
body_streams); it knows nothing of feeding text through them (clients.bridge.output_parser).
Plain Python, no MLX.
"""

from dataclasses import dataclass
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
