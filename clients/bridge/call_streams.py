"""An open tool call's body while it streams -> what of its calls is settled so far.

A streamer takes the text after a call's opening marker as far as it has come (the
parser holds back any tail that may begin the closing marker) and the request's tool
definitions, and answers one `Known(name, arguments, call_id)` per call whose name is
whole, in order. `arguments` is the part of that call's final arguments text that the
rest of the output cannot change: each answer's text begins with the one before, and
the text the family's reader (clients.bridge.calls, clients.bridge.call_bodies) gives
at the end begins with it when the markup is well formed.

Two kinds:
- the arguments are JSON text the model writes (qwen, kimi, deepseek, mistral's
  `NAME[ARGS]`, harmony): the text streams as it comes, from the object's `{` up to
  its closing `}` (read past strings, so a brace inside one does not count);
- the arguments are built from parameters (qwen_xml, glm, minimax, dsml): `{` once the
  name is whole, then `"key": value` for each parameter once its closing tag has come
  (`, ` between them, the value typed as the reader types it), then `}` once the call's
  own closing tag has come: the pieces of `json.dumps` of the final arguments.

`Streamed` turns the answers into parts as the body grows, and settles them with what
the reader gives when the call ends. The streamers of the bodies that hold lists of
calls or a syntax of their own are clients.bridge.body_streams'. Plain Python, no MLX.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Callable

from clients.bridge.call_bodies import string_arguments, typed_value
from clients.bridge.calls import DSML_PARAMETER, GLM_PAIR, XML_PARAMETER, Call, new_call_id
from clients.bridge.literals import json_value
from clients.bridge.parts import Part, ToolCallDelta, ToolCallEnd, ToolCallStart

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Known:
    """One call as far as it is settled: its name and the start of its arguments text."""

    name: str
    arguments: str
    call_id: str = ""  # the format's own id (kimi's `functions.NAME:I`); "": one is made


Streamer = Callable[[str, object], list[Known]]

# A JSON string (to its end or the text's) or a bracket: what decides an object's extent.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[{}\[\]]')


def json_object(text: str, at: int) -> tuple[str, bool]:
    """The JSON object that starts at `at` (`{` there, or nothing yet): its text so far,
    and whether it is whole. Not an object (`at` holds something else): ("", True)."""
    if at >= len(text):
        return "", False
    if text[at] != "{":
        return "", True
    depth = 0
    for m in _JSON_TOKEN.finditer(text, at):
        c = m.group()
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return text[at : m.end()], True
    return text[at:], False


def skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def pieces(pairs, whole: bool) -> str:
    """`{"k": v, ...` of the parameters read so far, `}` once the call is whole."""
    out, seen = [], set()
    for key, value in pairs:
        if key in seen:  # a repeated key: the final object keeps the last; stop here
            return "{" + ", ".join(out)
        seen.add(key)
        out.append(_dumps(key) + ": " + _dumps(value))
    return "{" + ", ".join(out) + ("}" if whole else "")


# -- the arguments as JSON text --------------------------------------------------------

_QWEN_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)


def qwen(body: str, tools=None) -> list[Known]:
    """`{"name": N, "arguments": {...}}`: once the arguments' `{` follows the name."""
    m = _QWEN_HEAD.match(body)
    if m is None or m.end() == len(body) or body[m.end()] != "{":
        return []
    name = json_value(m.group(1))
    return [Known(name, json_object(body, m.end())[0])] if isinstance(name, str) and name else []


_KIMI_HEAD = re.compile(r"\s*((?:functions\.)?([^\s:<]+):\d+)\s*<\|tool_call_argument_begin\|>\s*")


def kimi(body: str, tools=None) -> list[Known]:
    """`functions.NAME:I<|tool_call_argument_begin|>{...}`."""
    m = _KIMI_HEAD.match(body)
    if m is None or m.end() == len(body):
        return []
    text, _ = json_object(body, m.end())
    return [Known(m.group(2), text, m.group(1))] if text else []


_DEEPSEEK_SEP = "<｜tool▁sep｜>"


def deepseek(body: str, tools=None) -> list[Known]:
    """`NAME<｜tool▁sep｜>{...}` (the JSON may be in a ```json fence), or
    `function<｜tool▁sep｜>NAME` then a ```json fence."""
    name, sep, rest = body.partition(_DEEPSEEK_SEP)
    name = name.strip()
    if not sep or not name or any(c in name for c in "<>\n{"):
        return []
    at = skip_space(rest, 0)
    if name == "function" and at < len(rest) and rest[at] not in "{`":
        line, newline, tail = rest.partition("\n")
        if not newline:
            return []
        name, rest = line.strip(), tail
        at = skip_space(rest, 0)
    if rest.startswith("`", at):
        if len(rest) - at < len("```json"):
            return []
        if not rest.startswith("```json", at):
            return []
        at = skip_space(rest, at + len("```json"))
    text, _ = json_object(rest, at)
    return [Known(name, text)] if text else []


_MISTRAL_HEAD = re.compile(r"\s*([^\[\]{}<>\n]+?)\s*(?:\[CALL_ID\][^\[]*)?\[ARGS\]\s*")


def mistral(body: str, tools=None) -> list[Known]:
    """`NAME[ARGS]{...}` (`[CALL_ID]ID` may precede `[ARGS]`), one per `[TOOL_CALLS]`;
    the older JSON list comes whole."""
    out = []
    for piece in body.split("[TOOL_CALLS]"):
        m = _MISTRAL_HEAD.match(piece)
        if m is None:
            break
        text, whole = json_object(piece, m.end())
        if not text:
            break
        out.append(Known(m.group(1), text))
        if not whole:
            break
    return out


def harmony(body: str, tools=None) -> list[Known]:
    """`NAME<|channel|>commentary json<|message|>{...}` (or `NAME <|constrain|>json...`)."""
    head, marker, rest = body.partition("<|message|>")
    name = re.split(r"\s|<\|", head, maxsplit=1)[0]
    if not marker or not name:
        return []
    text, _ = json_object(rest, skip_space(rest, 0))
    return [Known(name, text)] if text else []


# -- the arguments built from parameters -----------------------------------------------

_XML_HEAD = re.compile(r"\s*<function=([^>\n]+)>")


def qwen_xml(body: str, tools=None) -> list[Known]:
    """`<function=NAME><parameter=K>\\nV\\n</parameter>...</function>`."""
    m = _XML_HEAD.match(body)
    if m is None:
        return []
    name = m.group(1).strip()
    inner, whole = until(body, m.end(), "</function>")
    strings = string_arguments(name, tools)
    pairs = [
        (k, typed_value(k, p.group(2), strings))
        for p in XML_PARAMETER.finditer(inner)
        for k in [p.group(1).strip()]
    ]
    return [Known(name, pieces(pairs, whole))]


def glm(body: str, tools=None) -> list[Known]:
    """`NAME<arg_key>K</arg_key><arg_value>V</arg_value>...`."""
    name, key, rest = body.partition("<arg_key>")
    name = name.strip()
    if not key or not name or any(c in name for c in "<>\n{"):
        return []
    strings = string_arguments(name, tools)
    pairs = [
        (k, typed_value(k, p.group(2).strip(), strings))
        for p in GLM_PAIR.finditer(key + rest)
        for k in [p.group(1).strip()]
    ]
    return [Known(name, pieces(pairs, False))]


_INVOKE_HEAD = re.compile(r'\s*<invoke name="([^"]+)">')
_MINIMAX_PARAMETER = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


def minimax(body: str, tools=None) -> list[Known]:
    """`<invoke name="N"><parameter name="K">V</parameter>...</invoke>`, one or more."""
    out, at = [], 0
    while (m := _INVOKE_HEAD.match(body, at)) is not None:
        name = m.group(1).strip()
        inner, whole = until(body, m.end(), "</invoke>")
        strings = string_arguments(name, tools)
        pairs = [
            (p.group(1), typed_value(p.group(1), p.group(2).strip("\n"), strings))
            for p in _MINIMAX_PARAMETER.finditer(inner)
        ]
        out.append(Known(name, pieces(pairs, whole)))
        if not whole:
            break
        at = m.end() + len(inner) + len("</invoke>")
    return out


def dsml(body: str, tools=None) -> list[Known]:
    """`NAME">` then `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`."""
    name, marker, rest = body.partition('">')
    name = name.strip()
    if not marker or not name or any(c in name for c in '<>"\n'):
        return []
    pairs = []
    for p in DSML_PARAMETER.finditer(rest):
        value = p.group(3)
        pairs.append((p.group(1), value if p.group(2) == "true" else json_value(value, value)))
    return [Known(name, pieces(pairs, False))]


def until(text: str, at: int, closer: str) -> tuple[str, bool]:
    """The text from `at` to `closer` (whole) or to the end (not yet)."""
    end = text.find(closer, at)
    return (text[at:], False) if end < 0 else (text[at:end], True)


STREAMERS: dict[str, Streamer] = {
    "qwen": qwen,
    "kimi": kimi,
    "deepseek": deepseek,
    "mistral": mistral,
    "harmony": harmony,
    "qwen_xml": qwen_xml,
    "glm": glm,
    "minimax": minimax,
    "dsml": dsml,
}


class Streamed:
    """The calls of the open call's body that went out: [index, text sent, ended] each.
    A call that a later one follows is whole: it ends then, with what it streamed."""

    def __init__(self):
        self.calls: list[list] = []

    def grow(self, known: list[Known], index: int, out: list[Part]) -> int:
        """Parts for what `known` settles beyond what went out; the next call index."""
        for n, k in enumerate(known):
            if n == len(self.calls):
                for entry in self.calls:
                    if not entry[2]:
                        entry[2] = True
                        out.append(_streamed_end(entry[0], entry[1]))
                self.calls.append([index, "", False])
                out.append(ToolCallStart(index, k.call_id or new_call_id(), k.name))
                index += 1
            at, sent, ended = self.calls[n]
            if not ended and len(k.arguments) > len(sent) and k.arguments.startswith(sent):
                out.append(ToolCallDelta(at, k.arguments[len(sent) :]))
                self.calls[n][1] = k.arguments
        return index

    def end(self, calls: list[Call], raw: str, index: int, out: list[Part]) -> int:
        """The body's end: each streamed call's rest of its reader's arguments text and its
        end (one whose markup broke: what it streamed, a parameter object closed), then the
        calls not streamed, whole; the next call index."""
        streamed, self.calls = self.calls, []
        for n, (at, sent, ended) in enumerate(streamed):
            call = calls[n] if n < len(calls) else None
            if ended:
                continue
            if call is not None and call.arguments_text.startswith(sent):
                if len(call.arguments_text) > len(sent):
                    out.append(ToolCallDelta(at, call.arguments_text[len(sent) :]))
                out.append(ToolCallEnd(at, call.arguments, raw))
                continue
            end = _streamed_end(at, sent)
            if end.arguments is None and _streamed_end(at, sent + "}").arguments:
                end = _streamed_end(at, sent + "}")  # its parameters, closed
                out.append(ToolCallDelta(at, "}"))
            if call is None or end.arguments != call.arguments:
                log.warning(
                    "bridge: a streamed tool call's markup did not parse; it ends with the "
                    "arguments it streamed: %.300r",
                    raw,
                )
            out.append(end)
        for call in calls[len(streamed) :]:
            out += [
                ToolCallStart(index, call.call_id, call.name),
                ToolCallDelta(index, call.arguments_text),
                ToolCallEnd(index, call.arguments, raw),
            ]
            index += 1
        return index


def _streamed_end(index: int, sent: str) -> ToolCallEnd:
    """The end of a streamed call, its arguments what it streamed (None: not an object)."""
    arguments = json_value(sent)
    return ToolCallEnd(index, arguments if isinstance(arguments, dict) else None, "")
