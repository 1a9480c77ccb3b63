"""The body of a tool call (the text between its markers) -> its calls, for the families
whose body holds a list of calls or a syntax of its own.

Each reader takes the body and the request's tool definitions and answers a list of
`(name, arguments, arguments_text)`, or None when the body is not that family's markup
(the endpoint then returns it as text). `arguments_text` is the model's own JSON text of
the arguments where the format carries one, so a client that sends it back re-renders
the same tokens; else the arguments' JSON. clients.bridge.parsers wires them to the
families' markers. Plain Python, no MLX.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Mapping

from clients.bridge.literals import UNREAD, json_at, json_value, python_tree, python_value

Read = list[tuple[str, dict, str]]


def _json_values(text: str) -> list | None:
    """The JSON values in `text`, one after another, separated by whitespace or `;`."""
    out, at = [], 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
        if at == len(text):
            return out
        found = json_at(text, at)
        if found is None:
            return None
        value, end = found
        out.append((value, text[at:end]))
        at = end


def _object_call(obj, name_keys=("name",), args_keys=("arguments", "parameters"), text=""):
    """`{"name": N, "arguments": {...}}` (the arguments may be a JSON string) -> a call;
    its arguments text the model's own where `text` (the object's) holds them as an object."""
    if not isinstance(obj, dict):
        return None
    name = next((obj[k] for k in name_keys if isinstance(obj.get(k), str)), None)
    if not name:
        return None
    key = next((k for k in args_keys if k in obj), None)
    args = obj[key] if key else {}
    if isinstance(args, str):
        args = json_value(args)
    if not isinstance(args, dict):
        return None
    own = _members(text).get(key) if text and isinstance(obj.get(key), dict) else None
    return name, args, own or json.dumps(args, ensure_ascii=False)


def _members(text: str) -> dict[str, str]:
    """A whole JSON object's text (one json_at read) -> each member's value text (the last
    of a repeated key)."""
    decoder, out, at = json.JSONDecoder(), {}, 1
    while True:
        at = _skip(text, at)
        if at >= len(text) or text[at] == "}":
            return out
        key, at = decoder.raw_decode(text, at)
        at = _skip(text, _skip(text, at) + 1)  # past the `:`
        _, end = decoder.raw_decode(text, at)
        out[key] = text[at:end]
        at = _skip(text, end)
        at += text.startswith(",", at)


def _elements(text: str) -> list[str]:
    """A whole JSON list's text -> its elements' texts."""
    decoder, out, at = json.JSONDecoder(), [], 1
    while True:
        at = _skip(text, at)
        if at >= len(text) or text[at] == "]":
            return out
        _, end = decoder.raw_decode(text, at)
        out.append(text[at:end])
        at = _skip(text, end)
        at += text.startswith(",", at)


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _fenced(text: str) -> str:
    """`text` without a markdown code fence around it (```json ... ```)."""
    text = text.strip()
    if text.startswith("```"):
        text = text[3:].removeprefix("json").strip()
        text = text.removesuffix("```").strip()
    return text


def json_list(body: str, tools=None, name_keys=("name",)) -> Read | None:
    """A JSON list of `{"name": ..., "arguments"|"parameters": {...}}` objects (nemotron,
    granite, phi4, Mistral's older `[TOOL_CALLS][...]`); a lone object is a list of one."""
    values = _json_values(_fenced(body))
    if not values or len(values) != 1:
        return None
    value, text = values[0]
    items = value if isinstance(value, list) else [value]
    texts = _elements(text) if isinstance(value, list) else [text]
    calls = [_object_call(o, name_keys, text=t) for o, t in zip(items, texts)]
    if not calls or any(c is None for c in calls):
        return None
    return calls


def cohere_list(body: str, tools=None) -> Read | None:
    """Command-R's list of `{"tool_name": ..., "parameters": {...}}` (R+ fences it in
    ```json)."""
    return json_list(body, tools, name_keys=("tool_name", "name"))


def llama3_objects(body: str, tools=None) -> Read | None:
    """Llama 3's `{"name": ..., "parameters": {...}}`, several separated by `;`."""
    values = _json_values(body)
    if not values:
        return None
    out = [_object_call(value, text=text) for value, text in values]
    return None if any(c is None for c in out) else out


def mistral_calls(body: str, tools=None) -> Read | None:
    """After `[TOOL_CALLS]`: a JSON list (Nemo, Small 3.1), or `NAME[ARGS]{...}` with an
    optional `[CALL_ID]ID` before `[ARGS]` (Small 3.2, Devstral, Ministral), one per
    `[TOOL_CALLS]`."""
    if body.lstrip().startswith("["):
        return json_list(body, tools)
    out = []
    for piece in body.split("[TOOL_CALLS]"):
        head, marker, args_text = piece.partition("[ARGS]")
        name = head.partition("[CALL_ID]")[0].strip()
        if not marker or not name or any(c in name for c in "[]{}<>\n"):
            return None
        values = _json_values(args_text)
        if not values or len(values) != 1 or not isinstance(values[0][0], dict):
            return None
        out.append((name, values[0][0], values[0][1]))
    return out


_INVOKE = re.compile(r'\s*<invoke name="([^"]+)">(.*?)</invoke>\s*', re.DOTALL)
_MINIMAX_PARAMETER = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


def string_arguments(name: str, tools) -> set[str]:
    """The parameters a tool declares as strings (their values are never JSON-decoded)."""
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return {
                k for k, v in props.items() if isinstance(v, Mapping) and v.get("type") == "string"
            }
    return set()


def typed_value(key: str, value: str, strings: set[str]):
    """A parameter's text as its value: JSON unless declared a string or not JSON."""
    return value if key in strings else json_value(value, value)


def minimax_invokes(body: str, tools=None) -> Read | None:
    """`<invoke name="N"><parameter name="K">V</parameter>...</invoke>`, one or more."""
    out, at = [], 0
    for m in _INVOKE.finditer(body):
        if body[at : m.start()].strip():
            return None
        at = m.end()
        name, rest = m.group(1).strip(), m.group(2)
        strings = string_arguments(name, tools)
        args = {
            p.group(1): typed_value(p.group(1), p.group(2).strip("\n"), strings)
            for p in _MINIMAX_PARAMETER.finditer(rest)
        }
        if _MINIMAX_PARAMETER.sub("", rest).strip():
            return None
        out.append((name, args, json.dumps(args, ensure_ascii=False)))
    if not out or body[at:].strip():
        return None
    return out


def harmony_call(body: str, tools=None) -> Read | None:
    """After `to=functions.`: `NAME<|channel|>commentary json<|message|>{...}` or
    `NAME <|constrain|>json<|message|>{...}` (gpt-oss writes either order)."""
    head, marker, args_text = body.partition("<|message|>")
    name = re.split(r"\s|<\|", head, maxsplit=1)[0]
    if not marker or not name:
        return None
    values = _json_values(args_text)
    if values is None or len(values) > 1:
        return None
    args, text = values[0] if values else ({}, "{}")
    if not isinstance(args, dict):
        return None
    return [(name, args, text)]


_GEMMA_QUOTE = '<|"|>'


def gemma_call(body: str, tools=None) -> Read | None:
    """`call:NAME{key:value,...}`: keys bare, strings between `<|"|>`, numbers, booleans,
    lists and nested objects as JSON writes them."""
    if not body.startswith("call:"):
        return None
    name, brace, rest = body[5:].partition("{")
    name = name.strip()
    if not brace or not name:
        return None
    text = gemma_json("{" + rest)
    args = json_value(text) if text is not None else None
    if not isinstance(args, dict):
        return None
    return [(name, args, json.dumps(args, ensure_ascii=False))]


def gemma_json(text: str) -> str | None:
    """Gemma's argument syntax as JSON text (None: a string is not closed)."""
    out, at = [], 0
    key = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*:")
    while at < len(text):
        if text.startswith(_GEMMA_QUOTE, at):
            end = text.find(_GEMMA_QUOTE, at + len(_GEMMA_QUOTE))
            if end < 0:
                return None
            out.append(json.dumps(text[at + len(_GEMMA_QUOTE) : end], ensure_ascii=False))
            at = end + len(_GEMMA_QUOTE)
            continue
        c = text[at]
        if c in "{,":
            out.append(c)
            at += 1
            m = key.match(text, at)
            if m is not None:
                out.append(json.dumps(m.group(1)) + ":")
                at = m.end()
            continue
        out.append(c)
        at += 1
    return "".join(out)


def pythonic_calls(body: str, tools=None) -> Read | None:
    """`[NAME(key=value, ...), ...]` with Python literals (Llama 4, Llama 3.2's pythonic)."""
    tree = python_tree(body.strip())
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    out = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = _dotted(node.func)
        if name is None:
            return None
        args = {k.arg: python_value(k.value, default=UNREAD) for k in node.keywords}
        if None in args or any(v is UNREAD for v in args.values()):
            return None
        out.append((name, args, json.dumps(args, ensure_ascii=False)))
    return out


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return head and f"{head}.{node.attr}"
    return None
