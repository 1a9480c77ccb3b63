"""Tool calls written as tags: the readers and streamers of six families whose calls are
XML-ish tags or JSON lines in tags of their own.

- `kimi_k3` (Kimi K3's XTML): after `<|open|>call tool="` the body
  `NAME" index="I"<|sep|>` then `<|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>`
  each (a `type="string"` value is text, the others JSON), or one
  `<|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>`;
- `minimax_m1`: inside `<tool_calls>`, one `{"name": N, "arguments": {...}}` a line;
- `minimax_m3`: inside `]<]minimax[>[<tool_call>`, `NS<invoke name="N">` then
  `NS<K>V NS</K>` each (NS: `]<]minimax[>[`), a value nested as tags (`NS<item>` for a
  list's items);
- `atem` (Muse Glimmer): the message ` to=N<|message|>` then `<atem:function_calls>`
  around `<atem:invoke name="N">` and `<atem:parameter name="K">V</atem:parameter>`;
- `minicpm` (MiniCPM 5): after `<function name="` the body
  `N"><param name="K">V</param>...` (a value may be in `<![CDATA[...]]>`; others are
  written as Python writes them);
- `hy3` (Hunyuan): after `<tool_call:opensource>` the body `N<tool_sep:opensource>` then
  `<arg_key:opensource>K</arg_key:opensource><arg_value:opensource>V</arg_value:opensource>`;
- `functionary_v3_1` (MeetKai): after `<function=` the body `N>{...}`; after
  `<|python_tag|>` the rest of the output, the code of a call to the request's `python`
  tool (`python_code`);
- `functionary_v3_2` (MeetKai): messages after `>>>`, a call `N\\n{...}` (text is the
  message `all\\n…`).

A reader takes a call's body (the text between the markers clients.bridge.parsers
wires it to) and the request's tool definitions, and answers
`[(name, arguments, arguments_text)]` or None where the body is not the family's
markup (clients.bridge.call_bodies' contract). A streamer takes an open body and
answers `Known` calls (clients.bridge.call_streams' contract): minimax_m1's and
functionary's arguments stream as the JSON text the model writes, the others parameter
by parameter once each parameter's closing tag has come. A value is typed as the other
XML-ish families type it: text where the tool declares a string, else JSON where it
decodes, else text.
Plain Python, no MLX.
"""

from __future__ import annotations

import html
import json
import re

from clients.bridge.call_bodies import Read, llama3_objects, string_arguments, typed_value
from clients.bridge.call_streams import Known, json_object, pieces, skip_space, until
from clients.bridge.literals import UNREAD, json_value, python_literal_text


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _read(name: str, pairs) -> tuple[str, dict, str]:
    args = dict(pairs)
    return name, args, _dumps(args)


# -- kimi_k3 ------------------------------------------------------------------------------

K3_OPEN, K3_SEP, K3_CLOSE = "<|open|>", "<|sep|>", "<|close|>"
_K3_HEAD = re.compile(r'([^"<>]+)"(?: [a-z_]+="[^"]*")*<\|sep\|>')
_K3_ARGUMENT = re.compile(
    r'<\|open\|>argument key="([^"]*)"(?: type="([a-z]*)")?<\|sep\|>'
    r"(.*?)<\|close\|>argument<\|sep\|>",
    re.DOTALL,
)
_K3_JSON = re.compile(
    r'<\|open\|>json(?: type="object")?<\|sep\|>(.*?)<\|close\|>json<\|sep\|>', re.DOTALL
)


def _k3_value(kind: str | None, text: str):
    return text if kind == "string" else json_value(text, text)


def kimi_k3(body: str, tools=None) -> Read | None:
    """`NAME" index="I"<|sep|>` then the arguments (module doc)."""
    head = _K3_HEAD.match(body)
    if head is None:
        return None
    name, rest = html.unescape(head.group(1)).strip(), body[head.end() :]
    block = _K3_JSON.fullmatch(rest.strip())
    if block is not None:
        args = json_value(block.group(1))
        return [(name, args, block.group(1).strip())] if isinstance(args, dict) else None
    pairs = [
        (html.unescape(m.group(1)), _k3_value(m.group(2), m.group(3)))
        for m in _K3_ARGUMENT.finditer(rest)
    ]
    if _K3_ARGUMENT.sub("", rest).strip():
        return None
    return [_read(name, pairs)]


def stream_kimi_k3(body: str, tools=None) -> list[Known]:
    head = _K3_HEAD.match(body)
    if head is None:
        return []
    rest = body[head.end() :]
    if rest.lstrip().startswith("<|open|>json"):  # a JSON block: whole at the end
        return []
    pairs = [
        (html.unescape(m.group(1)), _k3_value(m.group(2), m.group(3)))
        for m in _K3_ARGUMENT.finditer(rest)
    ]
    return [Known(html.unescape(head.group(1)).strip(), pieces(pairs, False))]


# -- minimax_m1 ---------------------------------------------------------------------------


def minimax_m1(body: str, tools=None) -> Read | None:
    """`{"name": N, "arguments": {...}}` a line."""
    return llama3_objects(body, tools)


_JSON_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)


def stream_minimax_m1(body: str, tools=None) -> list[Known]:
    """Each line's arguments from their `{`, as the model writes them."""
    out, at = [], 0
    while (m := _JSON_HEAD.match(body, at)) is not None and m.end() < len(body):
        if body[m.end()] != "{":
            break
        name = json_value(m.group(1))
        if not isinstance(name, str) or not name:
            break
        text, whole = json_object(body, m.end())
        out.append(Known(name, text))
        close = skip_space(body, m.end() + len(text))
        if not whole or close >= len(body) or body[close] != "}":
            break
        at = close + 1
    return out


# -- minimax_m3 ---------------------------------------------------------------------------

M3_NS = "]<]minimax[>["
_M3_INVOKE = re.compile(re.escape(M3_NS) + r'<invoke name="([^"]+)">')
_M3_TAG = re.compile(re.escape(M3_NS) + r"<([^<>/\s]+)>")


def _m3_children(text: str, settled: bool = False) -> list[tuple[str, str]] | None:
    """`NS<K>V NS</K>...` -> [(K, V)] (V the raw inner text); None: not only tags.
    `settled`: the text is cut short; the children whose closing tag has come."""
    out, at = [], 0
    while True:
        at = skip_space(text, at)
        if at == len(text):
            return out
        m = _M3_TAG.match(text, at)
        if m is None:
            return out if settled and M3_NS.startswith(text[at:][: len(M3_NS)]) else None
        key, depth, scan = m.group(1), 1, m.end()
        opener, closer = f"{M3_NS}<{key}>", f"{M3_NS}</{key}>"
        while depth:  # the matching closer (a key may nest inside itself)
            nxt, end = text.find(opener, scan), text.find(closer, scan)
            if end < 0:
                return out if settled else None
            if 0 <= nxt < end:
                depth, scan = depth + 1, nxt + len(opener)
            else:
                depth, scan = depth - 1, end + len(closer)
        out.append((key, text[m.end() : scan - len(closer)]))
        at = scan


def _m3_value(text: str, string: bool):
    """A value's inner text: nested tags a mapping (or a list of `item`s), else a scalar."""
    children = _m3_children(text) if M3_NS in text else None
    if children:
        if all(k == "item" for k, _ in children):
            return [_m3_value(v, False) for _, v in children]
        return {k: _m3_value(v, False) for k, v in children}
    return text if string else typed_value("", text, set())


def _m3_params(name: str, inner: str, tools, settled: bool = False):
    strings = string_arguments(name, tools)
    children = _m3_children(inner, settled)
    if children is None:
        return None
    return [(k, _m3_value(v, k in strings)) for k, v in children]


def minimax_m3(body: str, tools=None) -> Read | None:
    """`NS<invoke name="N">NS<K>V NS</K>... NS</invoke>`, one or more."""
    out, at, closer = [], 0, f"{M3_NS}</invoke>"
    while (m := _M3_INVOKE.search(body, at)) is not None:
        if body[at : m.start()].strip():
            return None
        end = body.find(closer, m.end())
        if end < 0:
            return None
        params = _m3_params(m.group(1), body[m.end() : end], tools)
        if params is None:
            return None
        out.append(_read(m.group(1), params))
        at = end + len(closer)
    return out if out and not body[at:].strip() else None


def stream_minimax_m3(body: str, tools=None) -> list[Known]:
    out, at, closer = [], 0, f"{M3_NS}</invoke>"
    while (m := _M3_INVOKE.match(body, skip_space(body, at))) is not None:
        inner, whole = until(body, m.end(), closer)
        params = _m3_params(m.group(1), inner, tools, settled=not whole) or []
        out.append(Known(m.group(1), pieces(params, whole)))
        if not whole:
            break
        at = m.end() + len(inner) + len(closer)
    return out


# -- atem (Muse Glimmer) ------------------------------------------------------------------

ATEM_CALLS = "<atem:function_calls>"
_ATEM_HEAD = re.compile(r"([^\s<>]+)<\|message\|>\s*" + ATEM_CALLS)
_ATEM_INVOKE = re.compile(r'\s*<atem:invoke name="([^"]+)">(.*?)</atem:invoke>\s*', re.DOTALL)
_ATEM_INVOKE_HEAD = re.compile(r'\s*<atem:invoke name="([^"]+)">')
_ATEM_PARAMETER = re.compile(r'<atem:parameter name="([^"]+)">(.*?)</atem:parameter>', re.DOTALL)


def _atem_pairs(name: str, inner: str, tools):
    strings = string_arguments(name, tools)
    return [
        (p.group(1), typed_value(p.group(1), p.group(2), strings))
        for p in _ATEM_PARAMETER.finditer(inner)
    ]


def atem(body: str, tools=None) -> Read | None:
    """After ` to=`: `N<|message|><atem:function_calls>` then its invokes."""
    head = _ATEM_HEAD.match(body)
    if head is None:
        return None
    rest, out, at = body[head.end() :], [], 0
    for m in _ATEM_INVOKE.finditer(rest):
        if m.start() != at or _ATEM_PARAMETER.sub("", m.group(2)).strip():
            return None
        out.append(_read(m.group(1), _atem_pairs(m.group(1), m.group(2), tools)))
        at = m.end()
    return out if out and at == len(rest) else None


def stream_atem(body: str, tools=None) -> list[Known]:
    head = _ATEM_HEAD.match(body)
    if head is None:
        return []
    out, at = [], head.end()
    while (m := _ATEM_INVOKE_HEAD.match(body, at)) is not None:
        inner, whole = until(body, m.end(), "</atem:invoke>")
        out.append(Known(m.group(1), pieces(_atem_pairs(m.group(1), inner, tools), whole)))
        if not whole:
            break
        at = m.end() + len(inner) + len("</atem:invoke>")
    return out


# -- minicpm ------------------------------------------------------------------------------

_CPM_HEAD = re.compile(r'([^"<>]+)">')
_CPM_PARAM = re.compile(r'<param name="([^"]+)">(.*?)</param>', re.DOTALL)
_CDATA = re.compile(r"<!\[CDATA\[(.*)\]\]>", re.DOTALL)


def _cpm_value(key: str, text: str, strings: set[str]):
    """Text in CDATA or declared a string as is; else JSON, else a Python literal (the
    template writes a value as Python prints it), else text."""
    cdata = _CDATA.fullmatch(text)
    if cdata is not None:
        return cdata.group(1)
    if key in strings:
        return text
    value = json_value(text, UNREAD)
    return python_literal_text(text, text) if value is UNREAD else value


def _cpm_pairs(name: str, inner: str, tools):
    strings = string_arguments(name, tools)
    return [
        (p.group(1), _cpm_value(p.group(1), p.group(2), strings))
        for p in _CPM_PARAM.finditer(inner)
    ]


def minicpm(body: str, tools=None) -> Read | None:
    """After `<function name="`: `N"><param name="K">V</param>...`."""
    head = _CPM_HEAD.match(body)
    if head is None:
        return None
    rest = body[head.end() :]
    if _CPM_PARAM.sub("", rest).strip():
        return None
    return [_read(head.group(1).strip(), _cpm_pairs(head.group(1).strip(), rest, tools))]


def stream_minicpm(body: str, tools=None) -> list[Known]:
    head = _CPM_HEAD.match(body)
    if head is None:
        return []
    name = head.group(1).strip()
    return [Known(name, pieces(_cpm_pairs(name, body[head.end() :], tools), False))]


# -- hy3 ----------------------------------------------------------------------------------

HY = ":opensource"
_HY_SEP = f"<tool_sep{HY}>"
_HY_PAIR = re.compile(
    rf"<arg_key{HY}>(.*?)</arg_key{HY}>\s*<arg_value{HY}>(.*?)</arg_value{HY}>", re.DOTALL
)


def _hy_head(body: str) -> tuple[str, str] | None:
    name, sep, rest = body.partition(_HY_SEP)
    name = name.strip()
    if not sep or not name or any(c in name for c in "<>\n{"):
        return None
    return name, rest


def _hy_pairs(name: str, rest: str, tools):
    strings = string_arguments(name, tools)
    return [
        (k, typed_value(k, m.group(2), strings))
        for m in _HY_PAIR.finditer(rest)
        for k in [m.group(1).strip()]
    ]


def hy3(body: str, tools=None) -> Read | None:
    """`N<tool_sep:opensource>` then `<arg_key:…>K</arg_key:…><arg_value:…>V</arg_value:…>`."""
    head = _hy_head(body)
    if head is None or _HY_PAIR.sub("", head[1]).strip():
        return None
    return [_read(head[0], _hy_pairs(*head, tools))]


def stream_hy3(body: str, tools=None) -> list[Known]:
    head = _hy_head(body)
    return [] if head is None else [Known(head[0], pieces(_hy_pairs(*head, tools), False))]


# -- functionary (MeetKai) ----------------------------------------------------------------

_FN_NAME = re.compile(r"[A-Za-z_][\w.-]*")


def _name_and_json(body: str, sep: str) -> Read | None:
    """`NAME` `sep` `{...}`: the name, and the arguments as the model wrote them."""
    name, marker, args_text = body.partition(sep)
    name, args_text = name.strip(), args_text.strip()
    if not marker or _FN_NAME.fullmatch(name) is None:
        return None
    args = json_value(args_text) if args_text else {}
    return [(name, args, args_text or "{}")] if isinstance(args, dict) else None


def _stream_name_and_json(body: str, sep: str) -> list[Known]:
    name, marker, rest = body.partition(sep)
    name = name.strip()
    if not marker or _FN_NAME.fullmatch(name) is None:
        return []
    text, _ = json_object(rest, skip_space(rest, 0))
    return [Known(name, text)] if text else []


def functionary_v3_1(body: str, tools=None) -> Read | None:
    """After `<function=`: `NAME>{...}`."""
    return _name_and_json(body, ">")


def stream_functionary_v3_1(body: str, tools=None) -> list[Known]:
    return _stream_name_and_json(body, ">")


def _python_tool(tools) -> tuple[str, str]:
    """The request's code tool, as llama.cpp finds it: its name (`python`, else
    `ipython`) and the argument its code goes in (the tool's one string parameter;
    `code` where it has none or several)."""
    found = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") in ("python", "ipython"):
            found.setdefault(fn["name"], fn)
    name = "ipython" if "ipython" in found and "python" not in found else "python"
    params = (found.get(name) or {}).get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    strings = [
        k for k, v in (props or {}).items() if isinstance(v, dict) and v.get("type") == "string"
    ]
    return name, strings[0] if len(strings) == 1 else "code"


def python_code(body: str, tools=None) -> Read | None:
    """After functionary v3.1's `<|python_tag|>`, to the output's end: the code of a call
    to the request's python tool (llama.cpp's reading). The published template writes a
    past call's arguments there as JSON (`| tojson`): an object is read as the
    arguments, a string as the code."""
    name, key = _python_tool(tools)
    text = body.strip()
    if not text:
        return None
    value = json_value(text, text)
    if isinstance(value, dict):
        return [(name, value, text)]
    args = {key: value if isinstance(value, str) else text}
    return [(name, args, json.dumps(args, ensure_ascii=False))]


def stream_python_code(body: str, tools=None) -> list[Known]:
    """The code as it comes, in its arguments' JSON (`{"code": "...`); an object as
    written; a JSON string only whole (at the end)."""
    name, key = _python_tool(tools)
    text = body.strip()
    if not text or text[0] == '"':
        return []
    if text[0] == "{":
        obj, _ = json_object(text, 0)
        return [Known(name, obj)]
    return [Known(name, json.dumps({key: text}, ensure_ascii=False)[:-2])]


def functionary_v3_2(body: str, tools=None) -> Read | None:
    """After `>>>`: `NAME\\n{...}`."""
    return _name_and_json(body, "\n")


def stream_functionary_v3_2(body: str, tools=None) -> list[Known]:
    return _stream_name_and_json(body, "\n")
