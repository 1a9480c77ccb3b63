"""Call bodies of the families whose calls sit between tags of their own: readers (the
whole body -> its calls) and streamers (the body so far -> what of its calls is settled).

- `apertus`: `[{"NAME": {...}}, ...]` (between `<|tools_prefix|>` and `<|tools_suffix|>`);
- `apriel`: `[{"name": ..., "arguments": {...}, "id": ...}, ...]` (in `<tool_calls>`);
- `seed_oss`: `<function=NAME><parameter=K>V</parameter>...</function>` (in
  `<seed:tool_call>`), a value as the template writes it: the text of a string, else
  JSON or the Python literal Jinja's `string` filter makes of it (`True`, `{'a': 1}`);
- `lfm2`: the pythonic list `[NAME(k=v), ...]` (LFM2.5) or a JSON list of
  `{"name", "arguments"}` (LFM2), in `<|tool_call_start|>`;
- `solar_open`: `ID<|tool_call:name|>NAME<|tool_call:args|>{...}` (after
  `<|tool_call:begin|>`); the call keeps the model's ID, which the template renders back.

GigaChat 3's body is Qwen's `{"name", "arguments"}` object (clients.bridge.calls).
The readers answer like clients.bridge.call_bodies (`(name, arguments, arguments_text)`,
None when the body is not the family's markup), Solar's a Call with its id; the
arguments text is the model's own where it writes JSON (apertus, apriel, solar_open),
so what streamed is where the reader's text begins. The streamers answer like
clients.bridge.call_streams (`Known` per call whose name is whole). Plain Python, no MLX.
"""

from __future__ import annotations

import ast
import json
import re

from clients.bridge.call_bodies import Read, json_list, pythonic_calls, string_arguments
from clients.bridge.call_streams import Known, json_object
from clients.bridge.calls import Call, new_call_id
from clients.bridge.literals import (
    UNREAD,
    json_at,
    json_value,
    python_literal_text,
    python_tree,
    python_value,
)

_STRING = r'"(?:[^"\\]|\\.)*"'
# The head of one item of a JSON list of calls, up to where its arguments object starts.
_NAMED = re.compile(r'\{\s*"name"\s*:\s*(' + _STRING + r')\s*,\s*"arguments"\s*:\s*')
_KEYED = re.compile(r"\{\s*(" + _STRING + r")\s*:\s*")


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _list(body: str, head: re.Pattern, keyed: bool = False) -> tuple[list[Known], bool]:
    """The calls of a JSON list whose items start with `head` (the name its group, the
    arguments object next), as far as `body` goes; and whether the list is whole and
    well formed (its `]` came, nothing after it but whitespace). `keyed`: an item is
    `{NAME: {...}}` and nothing more."""
    out: list[Known] = []
    at = _skip(body, 0)
    if not body.startswith("[", at):
        return out, False
    at += 1
    while True:
        item = _skip(body, at)
        m = head.match(body, item)
        if m is None or not body.startswith("{", m.end()):
            return out, False
        name = json_value(m.group(1))
        text, whole = json_object(body, m.end())
        if not isinstance(name, str) or not name or not text:
            return out, False
        out.append(Known(name, text))
        if not whole:
            return out, False
        found = json_at(body, item)  # the rest of the item (Apriel's "id"), to its `}`
        if found is None:
            return out, False
        value, at = found
        if not isinstance(value, dict) or (keyed and len(value) != 1):
            return out, False
        at = _skip(body, at)
        if body.startswith(",", at):
            at += 1
            continue
        return out, body.startswith("]", at) and _skip(body, at + 1) == len(body)


def _whole(known: list[Known], whole: bool) -> Read | None:
    if not known or not whole:
        return None
    out = [(k.name, json_value(k.arguments), k.arguments) for k in known]
    return out if all(isinstance(args, dict) for _, args, _ in out) else None


def apertus_calls(body: str, tools=None) -> Read | None:
    """Apertus: `[{"NAME": {...}}, ...]` (arguments written as a JSON string read too,
    their text then `json.dumps` of them)."""
    return _whole(*_list(body, _KEYED, keyed=True)) or _keyed_strings(body)


def _keyed_strings(body: str) -> Read | None:
    items = json_value(body)
    if not isinstance(items, list) or not items:
        return None
    out = []
    for item in items:
        if not isinstance(item, dict) or len(item) != 1:
            return None
        ((name, args),) = item.items()
        if isinstance(args, str):
            args = json_value(args)
        if not name or not isinstance(args, dict):
            return None
        out.append((name, args, json.dumps(args, ensure_ascii=False)))
    return out


def apertus(body: str, tools=None) -> list[Known]:
    return _list(body, _KEYED, keyed=True)[0]


def apriel_calls(body: str, tools=None) -> Read | None:
    """Apriel: `[{"name": ..., "arguments": {...}}, ...]` (an `"id"` may follow the
    arguments); any other JSON list of calls (arguments as a string, keys in another
    order) reads too, its arguments text then `json.dumps` of them."""
    return _whole(*_list(body, _NAMED)) or json_list(body, tools)


def apriel(body: str, tools=None) -> list[Known]:
    return _list(body, _NAMED)[0]


# -- Seed-OSS ------------------------------------------------------------------------

_SEED_HEAD = re.compile(r"\s*<function=([^>\n]+)>")
_SEED_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _seed_value(key: str, text: str, strings: set[str]):
    """A parameter's text as its value: the text where the tool declares a string, else
    JSON, else a Python literal (Jinja's `string` of a bool, list or dict), else the text."""
    if key in strings:
        return text
    value = json_value(text, UNREAD)
    return python_literal_text(text.strip(), text) if value is UNREAD else value


def _seed_pairs(inner: str, name: str, tools) -> list[tuple[str, object]]:
    strings = string_arguments(name, tools)
    return [
        (k, _seed_value(k, p.group(2), strings))
        for p in _SEED_PARAMETER.finditer(inner)
        for k in [p.group(1).strip()]
    ]


def _object_text(pairs, whole: bool) -> str:
    """`{"k": v, ...` of the parameters so far (json.dumps' own spacing), `}` once whole."""
    text = json.dumps(dict(pairs), ensure_ascii=False)
    return text if whole else text[:-1]


def seed_call(body: str, tools=None) -> Read | None:
    """Seed-OSS: `<function=NAME>\\n<parameter=K>V</parameter>\\n...</function>`."""
    m = _SEED_HEAD.match(body)
    end = body.rfind("</function>")
    if m is None or end < m.end() or body[end + len("</function>") :].strip():
        return None
    name, inner = m.group(1).strip(), body[m.end() : end]
    if not name or _SEED_PARAMETER.sub("", inner).strip():  # something besides parameters
        return None
    args = dict(_seed_pairs(inner, name, tools))
    return [(name, args, json.dumps(args, ensure_ascii=False))]


def seed(body: str, tools=None) -> list[Known]:
    m = _SEED_HEAD.match(body)
    if m is None:
        return []
    name = m.group(1).strip()
    end = body.find("</function>", m.end())
    inner = body[m.end() :] if end < 0 else body[m.end() : end]
    return [Known(name, _object_text(_seed_pairs(inner, name, tools), end >= 0))]


# -- LFM2 ----------------------------------------------------------------------------

_JSON_NAMES = {"true": True, "false": False, "null": None}


def python_literal(node):
    """A Python literal, where JSON's `true`, `false`, `null` may stand (LFM2.5 writes a
    dict argument with `tojson`); ast.literal_eval's contract (read it through
    clients.bridge.literals.python_value, which bounds its recursion)."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {python_literal(k): python_literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [python_literal(e) for e in node.elts]
    return ast.literal_eval(node)


def lfm2_calls(body: str, tools=None) -> Read | None:
    """LFM2: `[NAME(k=v), ...]` (LFM2.5), or a JSON list of `{"name", "arguments"}`."""
    found = pythonic_calls(body, tools)
    if found is not None:
        return found
    tree = python_tree(body.strip())
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    if not all(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) for c in tree.elts):
        return json_list(body, tools)
    out = []
    for c in tree.elts:
        args = {k.arg: python_value(k.value, python_literal, UNREAD) for k in c.keywords}
        if c.args or None in args or any(v is UNREAD for v in args.values()):
            return None
        out.append((c.func.id, args, json.dumps(args, ensure_ascii=False)))
    return out


# -- Solar Open ----------------------------------------------------------------------

# `ID<|tool_call:name|>NAME<|tool_call:args|>`: the id (may be empty) and the name
_SOLAR_HEAD = re.compile(
    r"\s*([^<\s]*)\s*<\|tool_call:name\|>\s*([^<\s]+)\s*<\|tool_call:args\|>\s*"
)


def solar_call(body: str, tools=None) -> Call | None:
    """Solar Open: `ID<|tool_call:name|>NAME<|tool_call:args|>{...}`."""
    m = _SOLAR_HEAD.match(body)
    if m is None:
        return None
    args_text = body[m.end() :].strip()
    args = json_value(args_text)
    if not isinstance(args, dict):
        return None
    return Call(m.group(2), args, args_text, m.group(1) or new_call_id())


def solar(body: str, tools=None) -> list[Known]:
    m = _SOLAR_HEAD.match(body)
    if m is None or m.end() == len(body):
        return []
    text, _ = json_object(body, m.end())
    return [Known(m.group(2), text, m.group(1))] if text else []
