"""An OpenAI Responses request's input as the engine's chat messages and tools.

`input` is a string (one user message) or items: `message` (roles user,
assistant, system, developer; `input_text` / `output_text` parts),
`function_call`, `function_call_output` and `reasoning`. A function call joins
the assistant message before it (one turn: its text, reasoning and calls), as
the chat template renders a turn; a reasoning item becomes the next assistant
turn's `reasoning_content` (the chat template writes it in the model's own
markup, or drops it); a call's output is a
`tool` message, whose `call_id` must answer a call made before it (in this
input or the stored conversation); calls that open a follow-up's input join the
stored reply's turn (`join_turns`). `instructions` are the system message, never
stored: a follow-up gives its own. A `function_call` with a `namespace` is
named as the model was offered it (clients.bridge.responses_tools). Every
refusal is an `InvalidInput` naming the field. It knows the Responses request
shapes; nothing of HTTP or the engine.
"""

from __future__ import annotations

import json
from typing import Any

from clients.bridge.responses_tools import offered_name
from clients.wire import InvalidInput

TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
MEDIA_PARTS = ("input_image", "input_file", "input_audio")
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _fail(where: str, message: str):
    raise InvalidInput(f"{where}: {message}")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        _fail(where, "must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            _fail(f"{where}[{j}]", "must be an object")
        kind = part.get("type")
        if kind in MEDIA_PARTS:
            _fail(f"{where}[{j}]", f"{kind} needs a vision model; this model reads text")
        if kind not in TEXT_PARTS:
            _fail(f"{where}[{j}].type", f"unknown content part type {kind!r}")
        texts.append(str(part.get("text", part.get("refusal", ""))))
    return "".join(texts)


def _reasoning_text(item: dict) -> str:
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        return ""
    return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def with_reasoning(message: dict, reasoning: str) -> dict:
    """An assistant message with its reasoning as `reasoning_content`, which the chat
    template writes in the model's own markup or drops."""
    if not reasoning:
        return message
    return dict(message, reasoning_content=reasoning)


def call_ids(messages) -> set[str]:
    """The ids of the tool calls made in `messages`."""
    return {c["id"] for m in messages for c in m.get("tool_calls", ()) if isinstance(c, dict)}


def messages_of(input_: Any, known_calls: set[str]) -> list[dict]:
    """`input` -> engine messages; `known_calls`: call ids of the stored conversation."""
    if isinstance(input_, str):
        return [{"role": "user", "content": input_}]
    if not isinstance(input_, list):
        _fail("input", "must be a string or a list of items")
    messages: list[dict] = []
    calls = set(known_calls)
    reasoning = ""  # for the next assistant turn
    for i, item in enumerate(input_):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            _fail(at, "must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = ROLES.get(item.get("role"))
            if role is None:
                _fail(
                    f"{at}.role",
                    f"expected user, assistant, system or developer, got {item.get('role')!r}",
                )
            message = {"role": role, "content": _text(item.get("content", ""), f"{at}.content")}
            if role == "assistant":
                message, reasoning = with_reasoning(message, reasoning), ""
            messages.append(message)
        elif kind == "reasoning":
            reasoning = "\n".join(t for t in (reasoning, _reasoning_text(item)) if t)
        elif kind == "function_call":
            for field in ("call_id", "name"):
                if not isinstance(item.get(field), str) or not item[field]:
                    _fail(f"{at}.{field}", "a function_call needs one")
            arguments = item.get("arguments", "{}")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            namespace = item.get("namespace")
            name = offered_name(item["name"], namespace if isinstance(namespace, str) else None)
            call = {"name": name, "arguments": arguments}
            call = {"id": item["call_id"], "type": "function", "function": call}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or reasoning:
                last = with_reasoning({"role": "assistant", "content": ""}, reasoning)
                messages.append(last)
                reasoning = ""
            last.setdefault("tool_calls", []).append(call)
            calls.add(item["call_id"])
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in calls:
                _fail(f"{at}.call_id", f"{call_id!r} answers no function_call before it")
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text(output, f"{at}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            _fail(f"{at}.type", f"unknown input item type {kind!r}")
    if reasoning:  # reasoning with no turn after it: the model's, continued
        messages.append(with_reasoning({"role": "assistant", "content": ""}, reasoning))
    return messages


def tool_choice_parses(choice: Any) -> bool:
    """Whether calls are parsed out of the reply: all but "none" (the engine holds the
    output to the choice: clients.constraints)."""
    if choice is None or choice in ("auto", "required"):
        return True
    if choice == "none":
        return False
    if isinstance(choice, dict) and choice.get("type") in ("function", "allowed_tools", "auto"):
        return True
    _fail("tool_choice", f"expected auto, none, required or a function, got {choice!r}")


def join_turns(history: list[dict], new: list[dict]) -> list[dict]:
    """`history` + `new`, where calls that open `new` (function_call items sent after the
    stored reply) join the reply's turn, as the model made them in it."""
    if not (history and new and history[-1]["role"] == "assistant"):
        return history + new
    first = new[0]
    if first["role"] != "assistant" or first.get("content") or not first.get("tool_calls"):
        return history + new
    reply = dict(history[-1])
    reply["tool_calls"] = list(reply.get("tool_calls", ())) + list(first["tool_calls"])
    return history[:-1] + [reply] + new[1:]
