"""What an output parser answers: the frozen parts a completion's text becomes (text,
reasoning, and a tool call's start, argument deltas and end). clients.bridge.parsers
makes them, the wire formats read them. Plain Python.
"""

from dataclasses import dataclass
from typing import Union


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
