"""An Anthropic Messages request as the engine's chat messages, tools and sampling.

`system` (a string or text blocks), `messages` (text, tool_use, tool_result,
thinking and redacted_thinking blocks; `system`-role messages of text, which
Claude Code sends), `tools` (with `input_schema`) and
`tool_choice` become the OpenAI-shaped messages and tools the engine's chat
template renders: a tool_result is a `tool` message, a tool_use an assistant
tool call, a thinking block the assistant turn's `reasoning_content`, which the
chat template writes in the model's own markup or drops (redacted thinking is
opaque and left out). A
`system`-role message stays where it is: before the first user message it joins
the system prompt (the template renders leading system messages as one system
block, the anchor); after it, it is the template's own system turn there, so the
anchor stays the `system` field and the tools.
`cache_control` breakpoints become `marks`: the engine messages whose blocks
carry one, where the client says it comes back (their ends become capture
points; a mark on the system prompt or the tools is the anchor's, which the
engine captures anyway). Anything the engine
cannot take is an `InvalidInput` naming the field: an unknown block type, an
image or document (the models served are text-only), a tool type Anthropic runs
itself, a tool_result whose `tool_use_id` answers no tool_use of the turn
before. It knows Anthropic's request shapes; nothing of HTTP or the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from clients.wire import InvalidInput

TOOL_CHOICES = ("auto", "any", "tool", "none")
MEDIA_BLOCKS = ("image", "document", "search_result", "container_upload")


@dataclass(frozen=True)
class Prompt:
    """What the engine renders: messages, tools, and whether the last turn is continued."""

    messages: tuple[dict, ...]
    tools: tuple[dict, ...]
    parse_tools: bool  # tool_choice none: the calls stay text
    continue_final: bool  # the last message is the assistant's (a prefill)
    marks: tuple[int, ...] = ()  # messages with a cache_control breakpoint (indexes)


def _fail(where: str, message: str):
    raise InvalidInput(f"{where}: {message}")


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        _fail(where, f"must be an object, got {type(value).__name__}")
    return value


def _text_of(blocks: Any, where: str) -> str:
    """A string, or text blocks joined; any other block is refused."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        _fail(where, "must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(blocks):
        block = _object(block, f"{where}[{j}]")
        kind = block.get("type")
        if kind in MEDIA_BLOCKS:
            _fail(f"{where}[{j}]", f"{kind} blocks need a vision model; this model reads text")
        if kind != "text" or not isinstance(block.get("text"), str):
            _fail(f"{where}[{j}].type", f"expected a text block, got {kind!r}")
        texts.append(block["text"])
    return "\n\n".join(texts)


def system_text(system: Any) -> str:
    """`system` as one text: a string, or its text blocks joined by blank lines."""
    return "" if system is None else _text_of(system, "system")


def tools_of(tools: Any) -> tuple[dict, ...]:
    """Anthropic tools -> OpenAI function tools; a tool Anthropic runs itself is refused."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        _fail("tools", "must be a list")
    out = []
    for i, tool in enumerate(tools):
        tool = _object(tool, f"tools[{i}]")
        kind = tool.get("type") or "custom"
        if kind != "custom":
            _fail(f"tools[{i}].type", f"{kind!r} is a tool this engine cannot run")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            _fail(f"tools[{i}].name", "a tool needs a name")
        schema = _object(tool.get("input_schema", {"type": "object"}), f"tools[{i}].input_schema")
        # OpenAI's key order: the template renders each tool as JSON, as it comes
        function = {"name": tool["name"]}
        if tool.get("description"):
            function["description"] = str(tool["description"])
        function["parameters"] = schema
        out.append({"type": "function", "function": function})
    return tuple(out)


def tool_choice_parses(choice: Any) -> bool:
    """Whether tool calls are parsed out of the reply: all but `none` (the engine holds
    the output to the choice: clients.constraints)."""
    if choice is None:
        return True
    choice = _object(choice, "tool_choice")
    if choice.get("type") not in TOOL_CHOICES:
        _fail("tool_choice.type", f"expected one of {', '.join(TOOL_CHOICES)}")
    return choice["type"] != "none"


def _assistant(blocks: Any, where: str) -> tuple[dict, set[str]]:
    """An assistant turn -> one message (text, reasoning, tool calls) and its tool_use ids."""
    if isinstance(blocks, str):
        return {"role": "assistant", "content": blocks}, set()
    if not isinstance(blocks, list):
        _fail(f"{where}.content", "must be a string or a list of blocks")
    texts, reasoning, calls = [], [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        block = _object(block, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue  # opaque: nothing the model could read
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not block["id"]:
                _fail(f"{at}.id", "a tool_use needs an id")
            if not isinstance(block.get("name"), str) or not block["name"]:
                _fail(f"{at}.name", "a tool_use needs a name")
            arguments = json.dumps(_object(block.get("input", {}), f"{at}.input"))
            call = {"name": block["name"], "arguments": arguments}
            calls.append({"id": block["id"], "type": "function", "function": call})
        elif kind in MEDIA_BLOCKS:
            _fail(at, f"{kind} blocks need a vision model; this model reads text")
        else:
            _fail(f"{at}.type", f"unknown block type {kind!r} in an assistant turn")
    message: dict = {"role": "assistant", "content": "".join(texts)}
    if reasoning:  # the chat template writes it in the model's own markup, or drops it
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message, {c["id"] for c in calls}


def _user(blocks: Any, where: str, open_calls: set[str]) -> list[dict]:
    """A user turn -> its tool results (as `tool` messages), then its text."""
    if isinstance(blocks, str) and open_calls:
        _fail(f"{where}.content", "the tool_use ids before it got no tool_result")
    if isinstance(blocks, str):
        return [{"role": "user", "content": blocks}]
    if not isinstance(blocks, list):
        _fail(f"{where}.content", "must be a string or a list of blocks")
    results, texts = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        block = _object(block, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if call_id not in open_calls:
                _fail(f"{at}.tool_use_id", f"{call_id!r} answers no tool_use of the turn before")
            open_calls.discard(call_id)
            content = block.get("content", "")
            text = _text_of(content, f"{at}.content") if content else ""
            if block.get("is_error"):
                text = "Error: " + text
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind in MEDIA_BLOCKS:
            _fail(at, f"{kind} blocks need a vision model; this model reads text")
        else:
            _fail(f"{at}.type", f"unknown block type {kind!r} in a user turn")
    if open_calls:
        missing = ", ".join(sorted(open_calls))
        _fail(f"{where}.content", f"tool_use ids without a tool_result: {missing}")
    text = "\n\n".join(texts)
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _marked(content: Any) -> bool:
    """Whether a message's content (or the system field) carries a cache_control."""
    blocks = content if isinstance(content, list) else []
    return any(isinstance(b, dict) and b.get("cache_control") for b in blocks)


def prompt_of(body) -> Prompt:
    """The request body (its `system`, `messages`, `tools`, `tool_choice`) -> Prompt."""
    if not isinstance(body.messages, list) or not body.messages:
        _fail("messages", "must be a non-empty list")
    system = system_text(body.system)
    messages = [{"role": "system", "content": system}] if system else []
    marks = [0] if system and _marked(body.system) else []
    open_calls: set[str] = set()
    for i, message in enumerate(body.messages):
        message = _object(message, f"messages[{i}]")
        if i and _marked(body.messages[i - 1].get("content")):
            marks.append(len(messages) - 1)  # where the marked message's turn ended
        role = message.get("role")
        if role == "assistant":
            if open_calls:
                _fail(f"messages[{i}]", "the tool_use ids before it got no tool_result")
            turn, open_calls = _assistant(message.get("content", ""), f"messages[{i}]")
            messages.append(turn)
        elif role == "user":
            messages += _user(message.get("content", ""), f"messages[{i}]", open_calls)
            open_calls = set()
        elif role == "system":
            if open_calls:
                _fail(f"messages[{i}]", "the tool_use ids before it got no tool_result")
            text = _text_of(message.get("content", ""), f"messages[{i}].content")
            messages.append({"role": "system", "content": text})
        else:
            _fail(f"messages[{i}].role", f"expected user, assistant or system, got {role!r}")
    if isinstance(body.messages[-1], dict) and _marked(body.messages[-1].get("content")):
        marks.append(len(messages) - 1)
    return Prompt(
        tuple(messages),
        tools_of(body.tools),
        tool_choice_parses(body.tool_choice),
        continue_final=body.messages[-1].get("role") == "assistant",
        marks=tuple(marks),
    )
