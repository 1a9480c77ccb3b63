"""Streamers for the call bodies clients.bridge.call_bodies reads: lists of calls and
syntaxes of their own. Each answers, like clients.bridge.call_streams' streamers, one
`Known(name, arguments)` per call whose name is whole, in order, `arguments` the part of
the call's final arguments text that the rest of the output cannot change.

- JSON lists and sequences of call objects (nemotron, granite, phi4, command_r in its
  ```json fence, command_r7b, Mistral's `[TOOL_CALLS][...]`, Llama 3's objects by `;`):
  a call starts once its object's name member is whole and its arguments member's `{`
  has come; the arguments stream as the model writes them, to their closing `}`. An
  object that names its arguments before its name, or writes them as a JSON string,
  streams nothing: it and the calls after it come whole when the body ends.
- Syntaxes that are not JSON (gemma4's `call:NAME{k:<|"|>v<|"|>}`, pythonic
  `[NAME(k=v), ...]`, whose values may be JSON's `true`, `false`, `null` as LFM2.5
  writes them): a call starts once `NAME{` or `NAME(` has come; each argument
  streams as the JSON of `"key": value` once its value is whole (the `,` or closing
  bracket after it has come), `{` before the first and `}` once the call closes: the
  pieces of `json.dumps` of the final arguments, which is what the readers give.

Plain Python, no MLX.
"""

from __future__ import annotations

import re

from clients.bridge import call_streams
from clients.bridge.call_bodies import gemma_json
from clients.bridge.call_bodies_tagged import python_literal
from clients.bridge.call_streams import Known, Streamer, json_object, pieces
from clients.bridge.literals import UNREAD, json_at, json_value, python_tree, python_value

NAME_KEYS = ("name",)
ARGUMENT_KEYS = ("arguments", "parameters")


def _space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _object_call(text: str, at: int, names=NAME_KEYS) -> tuple[Known | None, int | None]:
    """The call object that starts at `at` as far as it has come: (its Known, or None
    while its name or its arguments' `{` has not come; the index after the object once
    it is whole, else None)."""
    name, arguments = None, None
    at = _space(text, at + 1)  # past its `{`
    while at < len(text):
        if text[at] == "}":
            whole = at + 1
            return (Known(name, arguments) if name and arguments else None), whole
        if text[at] == ",":
            at = _space(text, at + 1)
            continue
        found = json_at(text, at)
        if found is None:
            break
        key, after = found
        at = _space(text, after)
        if at >= len(text) or text[at] != ":" or not isinstance(key, str):
            break
        at = _space(text, at + 1)
        if key in ARGUMENT_KEYS and arguments is None:
            if at >= len(text) or text[at] != "{" or not name:
                break  # a JSON string, or before the name: whole at the end
            arguments, done = json_object(text, at)
            if not done:
                return Known(name, arguments), None
            at = _space(text, at + len(arguments))
            continue
        found = json_at(text, at)
        if found is None:
            break
        value, after = found
        end = _space(text, after)
        if end >= len(text):  # a number may go on; any value is settled by what follows
            break
        if key in names and isinstance(value, str) and name is None:
            name = value
        at = end
    return (Known(name, arguments) if name and arguments else None), None


def json_calls(body: str, tools=None, names=NAME_KEYS) -> list[Known]:
    """A JSON list of call objects, or one object (a ```json fence around it allowed)."""
    at = _space(body, 0)
    if body.startswith("`", at):
        if not body.startswith("```json", at):
            return []
        at = _space(body, at + len("```json"))
    if at >= len(body):
        return []
    if body[at] == "{":
        known, _ = _object_call(body, at, names)
        return [known] if known else []
    if body[at] != "[":
        return []
    out = []
    at = _space(body, at + 1)
    while at < len(body) and body[at] == "{":
        known, end = _object_call(body, at, names)
        if known is None:
            break
        out.append(known)
        if end is None:
            break
        at = _space(body, end)
        if at >= len(body) or body[at] != ",":
            break
        at = _space(body, at + 1)
    return out


def cohere_calls(body: str, tools=None) -> list[Known]:
    """Command-R's `{"tool_name": ..., "parameters": {...}}` list."""
    return json_calls(body, tools, names=("tool_name", "name"))


def llama3_calls(body: str, tools=None) -> list[Known]:
    """Llama 3's `{"name": ..., "parameters": {...}}` objects, several by `;`."""
    out, at = [], _space(body, 0)
    while at < len(body) and body[at] == "{":
        known, end = _object_call(body, at)
        if known is None:
            break
        out.append(known)
        if end is None:
            break
        at = _space(body, end)
        if at < len(body) and body[at] == ";":
            at = _space(body, at + 1)
    return out


def mistral(body: str, tools=None) -> list[Known]:
    """After `[TOOL_CALLS]`: a JSON list, or `NAME[ARGS]{...}` (clients.bridge.call_streams)."""
    if body.lstrip().startswith("["):
        return json_calls(body, tools)
    return call_streams.mistral(body, tools)


# -- argument syntaxes of their own ---------------------------------------------------

_GEMMA_QUOTE = '<|"|>'
_GEMMA_HEAD = re.compile(r"call:([^{\s]+)\s*\{")
_GEMMA_KEY = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*:")


def gemma(body: str, tools=None) -> list[Known]:
    """`call:NAME{key:value,...}` (strings between `<|"|>`)."""
    m = _GEMMA_HEAD.match(body)
    if m is None:
        return []
    pairs, _, whole = _arguments(body, m.end(), "}", _GEMMA_KEY, _gemma_string, _gemma_value)
    return [Known(m.group(1), pieces(pairs, whole))]


def _arguments(body: str, at: int, closer: str, key_re, string, value):
    """The `key<sep>value, ...` arguments of one call from `at` up to its `closer`, each
    kept once its value is whole: (pairs, where reading stopped, whether the closer came).
    `string` finds a string's end, `value` reads a value's text (UNREAD: not one)."""
    pairs = []
    while True:
        at = _space(body, at)
        if body.startswith(closer, at):
            return pairs, at + len(closer), True
        key = key_re.match(body, at)
        if key is None:
            return pairs, at, False
        end = _value_end(body, key.end(), string)
        if end is None:
            return pairs, at, False
        read = value(body[key.end() : end])
        if read is UNREAD:
            return pairs, at, False
        pairs.append((key.group(1), read))
        at = end + 1 if body[end] == "," else end


def _gemma_value(text: str):
    return json_value(gemma_json(text) or "", UNREAD)


def _python_value(text: str):
    return python_value(python_tree(text.strip()), python_literal, UNREAD)


def _gemma_string(text: str, at: int) -> int | None:
    """The end of a Gemma string at `at` (None: not one, or not closed yet: -1)."""
    if not text.startswith(_GEMMA_QUOTE, at):
        return None
    end = text.find(_GEMMA_QUOTE, at + len(_GEMMA_QUOTE))
    return -1 if end < 0 else end + len(_GEMMA_QUOTE)


_PYTHON_HEAD = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\(")
_PYTHON_KEY = re.compile(r"\s*([A-Za-z_]\w*)\s*=")


def pythonic(body: str, tools=None) -> list[Known]:
    """`[NAME(key=value, ...), ...]` with Python literals."""
    at = _space(body, 0)
    if not body.startswith("[", at):
        return []
    out, at = [], at + 1
    while (m := _PYTHON_HEAD.match(body, at)) is not None:
        pairs, at, whole = _arguments(
            body, m.end(), ")", _PYTHON_KEY, _python_string, _python_value
        )
        out.append(Known(m.group(1), pieces(pairs, whole)))
        at = _space(body, at)
        if not whole or not body.startswith(",", at):
            break
        at += 1
    return out


_PYTHON_STRINGS = {
    q: re.compile(f"{q}(?:[^{q}\\\\]|\\\\.)*{q}", re.DOTALL) for q in ("'", '"')
}  # one-quoted literals, escapes read past


def pythonic_or_json(body: str, tools=None) -> list[Known]:
    """A pythonic list, or a JSON list of call objects (LFM2 writes either)."""
    at = _space(body, 0)
    if body.startswith("[", at) and body.startswith("{", _space(body, at + 1)):
        return json_calls(body, tools)
    return pythonic(body, tools)


def _python_string(text: str, at: int) -> int | None:
    """The end of a Python string literal at `at` (None: not one; -1: not closed yet)."""
    quote = text[at]
    if quote not in _PYTHON_STRINGS:
        return None
    if text.startswith(quote * 3, at):
        end = text.find(quote * 3, at + 3)
        return -1 if end < 0 else end + 3
    m = _PYTHON_STRINGS[quote].match(text, at)
    return -1 if m is None else m.end()


def _value_end(text: str, at: int, string) -> int | None:
    """Where the value at `at` ends: the index of the `,` or closing bracket after it at
    its own depth (None: not come yet). `string(text, k)` skips a string literal."""
    depth, k = 0, at
    while k < len(text):
        end = string(text, k)
        if end is not None:
            if end < 0:
                return None
            k = end
            continue
        c = text[k]
        if c in "{[(":
            depth += 1
        elif c in "}])":
            if depth == 0:
                return k
            depth -= 1
        elif c == "," and depth == 0:
            return k
        k += 1
    return None


STREAMERS: dict[str, Streamer] = {
    "mistral": mistral,
    "llama3_json": llama3_calls,
    "pythonic": pythonic,
    "lfm2": pythonic_or_json,
    "gemma4": gemma,
    "command_r": cohere_calls,
    "command_r7b": cohere_calls,
    "nemotron": json_calls,
    "granite": json_calls,
    "phi4": json_calls,
}
