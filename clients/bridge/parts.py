"""What an output parser answers: the frozen parts a completion's text becomes (text,
reasoning, and a tool call's start, argument deltas and end), and `joined`, a whole
completion's parts as its text, reasoning and calls. clients.bridge.parsers makes them,
the wire formats read them. Plain Python.
"""

from dataclasses import dataclass
from typing import Sequence, Union


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
    arguments: dict | None  # None: the markup did not parse; `raw` goes out as text
    raw: str


Part = Union[TextPart, ReasoningPart, ToolCallStart, ToolCallDelta, ToolCallEnd]


def joined(parts: Sequence[Part]) -> tuple[str, str, list[tuple[ToolCallStart, ToolCallEnd]]]:
    """Parts of a whole completion -> (text, reasoning, [(start, end)] of the calls). A call
    that did not parse and was not streamed is in the text, as its raw markup; one that was
    streamed is a call (its end's `arguments` None when what it streamed is no object)."""
    text, reasoning, calls, starts = [], [], [], {}
    for p in parts:
        if isinstance(p, TextPart):
            text.append(p.text)
        elif isinstance(p, ReasoningPart):
            reasoning.append(p.text)
        elif isinstance(p, ToolCallStart):
            starts[p.index] = p
        elif isinstance(p, ToolCallEnd):
            if p.index in starts:
                calls.append((starts.pop(p.index), p))
            else:
                text.append(p.raw)
    return "".join(text), "".join(reasoning), calls
