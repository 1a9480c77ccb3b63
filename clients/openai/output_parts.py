"""The completion's text as typed parts: text, reasoning, tool calls.

The wire formats of clients.openai build their content blocks and output items
from these parts. The interface is the one of the per-family parsers
(`clients/openai/parsers.py`, issue 25's other half): `make_parser(family)`
gives an `OutputParser` whose `feed(text)` and `close()` return parts. Until that
module lands, this one is a local adapter for the Qwen family alone (a leading
`<think>...</think>` as reasoning, `<tool_call>` JSON blocks as tool calls, over
clients.openai.tool_calls); replacing its body with an import of the parsers
module is the one change the swap needs.

Markup never reaches a text or reasoning part, wherever the deltas split it. A
tool call comes whole at close() (start, its arguments, end); a block whose JSON
is malformed ends with `arguments` None and its raw text, which the endpoints
return as text. It knows text; nothing of HTTP or the engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Protocol, Union

from clients.openai.tool_calls import (
    TOOL_CALL_END,
    TOOL_CALL_START,
    ToolCallStream,
    parse_tool_calls,
)

THINK_START, THINK_END = "<think>", "</think>"
_BLOCK = re.compile(
    re.escape(TOOL_CALL_START) + r".*?(?:" + re.escape(TOOL_CALL_END) + r"|\Z)", re.S
)


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ReasoningPart:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    call_id: str
    name: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    arguments_text: str


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    arguments: dict | None  # None: the call's JSON is malformed; `raw` is its text
    raw: str


Part = Union[TextPart, ReasoningPart, ToolCallStart, ToolCallDelta, ToolCallEnd]


class OutputParser(Protocol):
    def feed(self, text: str) -> list[Part]: ...

    def close(self) -> list[Part]: ...


def make_parser(family: str = "") -> OutputParser:
    """The parser of a model family (ModelInfo's output format); the Qwen one for now."""
    # TODO(issue 25): return clients.openai.parsers.make_parser(family) once it lands.
    return QwenParser()


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class QwenParser:
    """A leading `<think>` block as reasoning, then text with `<tool_call>` JSON blocks."""

    def __init__(self):
        self._state = "start"  # start -> reasoning -> text, or start -> text
        self._held = ""
        self._fresh = True  # nothing of this section sent yet: its leading blank lines go
        self._tools = ToolCallStream()  # text, less what may start a tool call
        self._text_out = 0  # characters of the text section sent
        self._all = ""  # the text section, as fed

    def feed(self, text: str) -> list[Part]:
        self._held += text
        parts: list[Part] = []
        if self._state == "start":
            lead = self._held.lstrip()
            if THINK_START.startswith(lead):  # maybe the tag, not whole yet
                return parts
            self._state = "text"
            if lead.startswith(THINK_START):
                self._state, self._held = "reasoning", lead[len(THINK_START) :]
        if self._state == "reasoning":
            at = self._held.find(THINK_END)
            if at < 0:  # hold what may begin the end tag, and the newlines before it
                cut = len(self._held) - _held_prefix(self._held, THINK_END)
                cut = len(self._held[:cut].rstrip("\n"))
                reasoning, self._held = self._held[:cut], self._held[cut:]
                return self._reasoning(reasoning)
            parts += self._reasoning(self._held[:at].rstrip("\n"))
            self._state, self._held, self._fresh = "text", self._held[at + len(THINK_END) :], True
        return parts + self._text(self._take())

    def _take(self) -> str:
        text, self._held = self._held, ""
        return text

    def _lead(self, text: str) -> str:
        if self._fresh:
            text = text.lstrip()
            self._fresh = not text
        return text

    def _reasoning(self, text: str) -> list[Part]:
        text = self._lead(text)
        return [ReasoningPart(text)] if text else []

    def _text(self, text: str) -> list[Part]:
        text = self._lead(text)
        out = self._tools.feed(text) if text else ""
        self._all += text
        self._text_out += len(out)
        return [TextPart(out)] if out else []

    def close(self) -> list[Part]:
        if self._state == "reasoning":  # cut off while reasoning
            return self._reasoning(self._take())
        parts = self._text(self._take())
        rest = self._all[self._text_out :]  # held back: a tag's start, or the tool calls
        if TOOL_CALL_START not in rest:
            return parts + ([TextPart(rest)] if rest else [])
        return parts + _calls(rest)


def _calls(text: str) -> list[Part]:
    """The tool-call blocks of `text`, each whole or malformed, and the text beside them."""
    parts: list[Part] = []
    index = 0
    for found in _BLOCK.finditer(text):
        raw = found.group(0)
        _, calls = parse_tool_calls(raw)
        if not calls:
            parts.append(ToolCallEnd(index, None, raw))
        else:
            fn = calls[0]["function"]
            arguments = _as_object(fn["arguments"])
            parts.append(ToolCallStart(index, calls[0]["id"], fn["name"]))
            parts.append(ToolCallDelta(index, fn["arguments"]))
            parts.append(ToolCallEnd(index, arguments, raw))
        index += 1
    outside = [t.strip() for t in _BLOCK.split(text) if t.strip()]
    text_parts: list[Part] = [TextPart("\n".join(outside))] if outside else []
    return text_parts + parts


def _as_object(arguments: str) -> dict | None:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


__all__ = [
    "OutputParser",
    "Part",
    "ReasoningPart",
    "TextPart",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "make_parser",
]
