"""A completion as content blocks: what the Anthropic and Responses formats both build from.

`Blocks` takes the engine's token chunks, runs them through the model family's
output parser (clients.bridge.parsers) and says when a block opens, grows
and closes: text, reasoning, or a tool call. One block is open at a time; a
part of another kind closes it. A tool call opens at the parser's
ToolCallStart, grows by its arguments deltas and closes at its ToolCallEnd;
one whose markup is malformed and that streamed nothing becomes text, with a
warning in the log, so nothing the model wrote is lost and no markup leaks.
It also counts the completion's reasoning tokens (a chunk's ids go to the
kind of the next part they produced). It knows parts
and engine chunks; nothing of HTTP or of either wire's shapes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from clients.bridge.parsers import (
    OutputParser,
    ReasoningPart,
    TextPart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)

log = logging.getLogger(__name__)

TEXT, REASONING, TOOL_CALL = "text", "reasoning", "tool_call"


@dataclass
class Block:
    """One content block: its kind, its text (a tool call's: its arguments' JSON text, as
    streamed)."""

    index: int
    kind: str
    text: str = ""
    call_id: str = ""
    name: str = ""
    arguments: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Opened:
    block: Block


@dataclass(frozen=True)
class Grew:
    block: Block
    delta: str


@dataclass(frozen=True)
class Closed:
    block: Block


BlockEvent = Opened | Grew | Closed


class Blocks:
    """Token chunks -> block events, and the finished blocks."""

    def __init__(self, parser: OutputParser):
        self.parser = parser
        self.blocks: list[Block] = []
        self.reasoning_tokens = 0
        self._open: Block | None = None
        self._calls: dict[int, ToolCallStart] = {}
        self._pending_ids = 0  # ids whose text the parser holds, not yet in a part

    @property
    def tool_calls(self) -> list[Block]:
        return [b for b in self.blocks if b.kind == TOOL_CALL]

    def feed(self, text: str, ids: int = 0) -> list[BlockEvent]:
        """One chunk of the completion: its text and how many token ids it carried."""
        parts = self.parser.feed(text) if text else []
        self._pending_ids += ids
        if parts:
            if isinstance(parts[0], ReasoningPart):
                self.reasoning_tokens += self._pending_ids
            self._pending_ids = 0
        return self._parts(parts)

    def close(self) -> list[BlockEvent]:
        """The end of the completion: what the parser held, and the last block closed."""
        events = self._parts(self.parser.close())
        return events + self._close_open()

    def _parts(self, parts) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        for part in parts:
            if isinstance(part, TextPart):
                events += self._grow(TEXT, part.text)
            elif isinstance(part, ReasoningPart):
                events += self._grow(REASONING, part.text)
            elif isinstance(part, ToolCallStart):
                events += self._close_open()
                block = Block(len(self.blocks), TOOL_CALL, "", part.call_id, part.name)
                self.blocks.append(block)
                self._calls[part.index] = block
                events.append(Opened(block))
            elif isinstance(part, ToolCallDelta):
                block = self._calls[part.index]
                block.text += part.arguments_text
                events.append(Grew(block, part.arguments_text))
            elif isinstance(part, ToolCallEnd):
                events += self._tool_call(part)
        return events

    def _grow(self, kind: str, text: str) -> list[BlockEvent]:
        if not text:
            return []
        events: list[BlockEvent] = []
        if self._open is None or self._open.kind != kind:
            events += self._close_open()
            self._open = Block(len(self.blocks), kind)
            self.blocks.append(self._open)
            events.append(Opened(self._open))
        self._open.text += text
        events.append(Grew(self._open, text))
        return events

    def _tool_call(self, end: ToolCallEnd) -> list[BlockEvent]:
        block = self._calls.pop(end.index, None)
        if block is None:
            if end.raw:
                log.warning("bridge: malformed tool call returned as text: %.200r", end.raw)
            return self._grow(TEXT, end.raw)  # "": a call the output's end cut, dropped
        # arguments None: a streamed call whose text is no object (the parser logged it)
        block.arguments = end.arguments if end.arguments is not None else {}
        return [Closed(block)]

    def _close_open(self) -> list[BlockEvent]:
        if self._open is None:
            return []
        block, self._open = self._open, None
        return [Closed(block)]
