"""The tool grammars of the families whose calls are tags (`Markup.shape` "tags").

Each family's calls as its published chat template writes a past call
(clients.bridge.tag_calls reads them back):

- `minimax_m1`: `<tool_calls>` then one `{"name": N, "arguments": {...}}` a line, then
  `</tool_calls>`;
- `minimax_m3`: `NS<tool_call>` (NS: `]<]minimax[>[`), a line per
  `NS<invoke name="N">` with `NS<K>V NS</K>` each (an object's keys and a list's
  `NS<item>`s nested the same way), `NS</tool_call>`; the model's reasoning
  `<mm:think>…</mm:think>`, or `</mm:think>` alone, may come first;
- `minicpm`: `<function name="N"><param name="K">V</param>…</function>`, a line each;
- `hy3`: `<tool_calls:opensource>` around `<tool_call:opensource>N<tool_sep:opensource>`
  and `<arg_key:…>K</arg_key:…>` / `<arg_value:…>V</arg_value:…>` lines;
- `kimi_k3`: the response block `<|open|>response<|sep|>…<|close|>response<|sep|>`
  (the turn's text), then `<|open|>tools<|sep|>` around
  `<|open|>call tool="N" index="I"<|sep|>` calls of
  `<|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>` (T the value's JSON
  type), then `<|close|>message<|sep|>`;
- `atem` (Muse Glimmer): messages. Reasoning ` to=self<|message|>…<|eom|><|start|>assistant`,
  then either a call message ` to=N<|message|><atem:function_calls>\\n<atem:invoke
  name="N">\\n` with `<atem:parameter name="K">V</atem:parameter>\\n` each (several
  separated by `<|eom|><|start|>assistant`) or the answer ` to=user<|message|>…`.
  Like harmony its output is messages from the first character: `auto` holds the whole
  output (a call or the answer), not a lazy trigger;
- `functionary_v3_1`: `<function=N>{...}</function>`, one after another;
- `functionary_v3_2`: messages after the generation prompt's `>>>` (held whole like
  atem's): text `all\\n…`, or calls `N\\n{...}` separated by `>>>`.

Parameters go one per declared property, in order, the required ones present; a string
as free text up to its closing tag, an enum of strings as one of them, anything else
as JSON (engine.runtime.structured.values). `tag_start` answers the start rule's body
for a `tool_choice`; engine.runtime.structured.tools adds a `-thinking` format's
reasoning before it. Plain Python: no llguidance, no MLX.
"""

from __future__ import annotations

import json
from typing import Mapping

from engine.runtime.structured.schema import closed
from engine.runtime.structured.values import ANY_NAME, Values, is_string, string_enum

NS = "]<]minimax[>["
HY = ":opensource"
K3_RESPONSE = ("<|open|>response<|sep|>", "<|close|>response<|sep|>")
K3_TOOLS = ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>")
K3_END = "<|close|>message<|sep|>"
ANY_TEXT = "/(.|\\n)*/"  # any text (never an added token)
ONE_LINE = r"[\x20\x09]{0,8}"  # whitespace between JSON tokens that keeps a call on its line
QUOTE_END = '">'  # the end of a name="…" attribute and its tag
M3_INVOKE = NS + '<invoke name="'
CPM_PARAM = '<param name="'
K3_CALL = ('<|open|>call tool="', '" index="', '"<|sep|>', "<|close|>call<|sep|>")
K3_ARGUMENT = ('<|open|>argument key="', '" type="', '"<|sep|>', "<|close|>argument<|sep|>")
# family -> an optional block of reasoning the model writes first (open, close; a bare
# close where the template writes one for a turn without reasoning)
_REASONING = {
    "minimax_m1": ("<think>", "</think>", False),
    "minimax_m3": ("<mm:think>", "</mm:think>", True),
    "minicpm": ("<think>", "</think>", False),
    "hy3": (f"<think{HY}>", f"</think{HY}>", False),
}


def tag_start(g, markup, calls: Mapping[str, Mapping], choice: str, one: bool) -> str:
    """The start rule's body for `choice` (auto, required, function, none) over `calls`
    (name -> parameters schema); `one`: a single call."""
    family = markup.args
    if family == "atem":
        return _atem(g, calls, choice, one)
    if family == "kimi_k3":
        return _kimi_k3(g, calls, choice, one)
    if family == "functionary_v3_2":
        return _functionary_v3_2(g, calls, choice, one)
    opener = markup.opener
    text = g.text(opener)
    if family in _REASONING:
        open_, close, bare = _REASONING[family]
        block = f"{g.m(open_)} {g.until(close)}" + (f" | {g.m(close)}" if bare else "")
        pre = f"{g.define('reasoning', block)}? "
    else:
        pre = ""
    if choice == "none" or not calls:
        return f"{pre}{text}"
    rest = _after_opener(g, markup, calls, one)
    if choice in ("required", "function"):
        return f"{pre}{g.m(opener)} {rest}"
    if g.token(opener) or g.token(g.pieces(opener)[0]):
        return f"{pre}{text} ({g.m(opener)} {rest} {text})*"
    return f"{pre}({g.until(opener)} {rest})* {text}"


def _after_opener(g, markup, calls, one: bool) -> str:
    """The calls after the family's opener, through its closer."""
    family = markup.args
    if family == "minimax_m1":
        objects = {"anyOf": [_call_object(n, s) for n, s in calls.items()]}
        call = g.json(objects, ONE_LINE)  # one call a line
        many = call if one else f'{call} ("\\n" {call})*'
        return f'"\\n" {many} "\\n" {g.m(markup.closer)}'
    if family == "minicpm":
        call = _one_of(g, calls, lambda n, s: f"{_lit(n)} {g.m(QUOTE_END)} {_params(g, family, s)}")
        call = f"{call} {g.m('</function>')}"
        return call if one else f'{call} ("\\n"? {g.m(markup.opener)} {call})*'
    if family == "minimax_m3":
        call = _one_of(
            g,
            calls,
            lambda n, s: (
                f"{g.m(M3_INVOKE)} {_lit(n)} {g.m(QUOTE_END)} "
                f'{_params(g, family, s)} {g.m(NS + "</invoke>")} "\\n"'
            ),
        )
        many = call if one else f"{call}+"
        return f'"\\n" {many} {g.m(markup.closer)}'
    if family == "hy3":
        call = _one_of(
            g,
            calls,
            lambda n, s: (
                f"{g.m(f'<tool_call{HY}>')} {_lit(n)} {g.m(f'<tool_sep{HY}>')} "
                f'"\\n" {_params(g, family, s)} {g.m(f"</tool_call{HY}>")} "\\n"'
            ),
        )
        many = call if one else f"{call}+"
        return f'"\\n" {many} {g.m(markup.closer)}'
    if family == "functionary_v3_1":
        call = _one_of(
            g, calls, lambda n, s: f'{_lit(n)} ">" {g.json(closed(s))} {g.m(markup.closer)}'
        )
        return call if one else f"{call} ({g.m(markup.opener)} {call})*"
    raise AssertionError(family)


def _functionary_v3_2(g, calls, choice: str, one: bool) -> str:
    """Messages after the generation prompt's `>>>`: text `all\\n…` up to the next `>>>`,
    calls `NAME\n{...}` separated by `>>>`."""
    answer = f'"all\\n" {g.define("FREE", ANY_TEXT)}'
    if choice == "none" or not calls:
        return answer
    call = _one_of(g, calls, lambda n, s: f'{_lit(n)} "\\n" {g.json(closed(s))}')
    many = call if one else f'{call} (">>>" {call})*'
    text_first = f'("all\\n" {g.until(">>>")})?'
    if choice in ("required", "function"):
        return f"{text_first} {many}"
    return f"{text_first} {many} | {answer}"


def _kimi_k3(g, calls, choice: str, one: bool) -> str:
    """The response block (free text in it, none for required and a named tool), the
    tools block, the message's end."""
    open_, close = K3_RESPONSE
    end = f"({g.m(K3_END)})?"
    if choice in ("required", "function"):
        response = f"({g.m(open_)} {g.m(close)})?"
    else:
        response = f"{g.define('response', f'{g.m(open_)} {g.until(close)}')}?"
    if choice == "none" or not calls:
        return f"{response} {end}"

    def call(n, s):
        tool, index, sep, end = (g.m(t) for t in K3_CALL)
        return f"{tool} {_lit(n)} {index} /[0-9]{{1,3}}/ {sep} {_params(g, 'kimi_k3', s)} {end}"

    calls_rule = _one_of(g, calls, call)
    many = calls_rule if one else f"{calls_rule}+"
    tools = f"{g.m(K3_TOOLS[0])} {many} {g.m(K3_TOOLS[1])}"
    if choice == "auto":
        tools = f"({tools})?"
    return f"{response} {tools} {end}"


def _atem(g, calls, choice: str, one: bool) -> str:
    message, start = g.m("<|message|>"), g.m("<|start|>")
    thought = f'" to=self" {message} {g.until("<|eom|>")} {start} "assistant"'
    reasoning = f"{g.define('reasoning', thought)}*"
    final = f'" to=user" {message} {g.define("FREE", ANY_TEXT)}'
    if choice == "none" or not calls:
        return f"{reasoning} {final}"

    def call(n, s):
        head = _lit(f'<atem:function_calls>\n<atem:invoke name="{n}">\n')
        tail = _lit("</atem:invoke>\n</atem:function_calls>")
        return f'" to=" {_lit(n)} {message} {head} {_params(g, "atem", s)} {tail}'

    one_call = _one_of(g, calls, call)
    many = one_call if one else f'{one_call} ({g.m("<|eom|>")} {start} "assistant" {one_call})*'
    if choice in ("required", "function"):
        return f"{reasoning} {many}"
    return f"{reasoning} ({many} | {final})"


def _one_of(g, calls, write) -> str:
    return g.define("call", " | ".join(write(n, s) for n, s in calls.items()))


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _call_object(name: str, params: Mapping) -> dict:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": closed(params)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


# -- parameters -----------------------------------------------------------------------

_K3_TYPES = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean"}
_K3_TYPES |= {"object": "object", "array": "array", "null": "null"}


def _params(g, family: str, schema) -> str:
    """The parameters of one call: one per declared property, in order (module doc)."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if not props:
        return f"{g.define('param', _param(g, family, ANY_NAME, {}))}*"
    required = set(schema.get("required", ()))
    parts = []
    for key, sub in props.items():
        rule = g.define("param", _param(g, family, _lit(key), sub))
        parts.append(rule if key in required else f"{rule}?")
    return " ".join(parts)


def _param(g, family: str, key: str, schema) -> str:
    """One parameter; `key` its grammar (a literal, or any name)."""
    values = Values(g, "minimax")
    if family == "minicpm":
        return f"{g.m(CPM_PARAM)} {key} {g.m(QUOTE_END)} {values.until_closer(schema, '</param>')}"
    if family == "atem":
        close = "</atem:parameter>"
        return f'"<atem:parameter name=\\"" {key} "\\">" {values.until_closer(schema, close)} "\\n"'
    if family == "hy3":
        head = f'{g.m(f"<arg_key{HY}>")} {key} {g.m(f"</arg_key{HY}>")} "\\n" '
        value = values.until_closer(schema, f"</arg_value{HY}>")
        return f'{head}{g.m(f"<arg_value{HY}>")} {value} "\\n"'
    if family == "kimi_k3":
        t = schema.get("type") if isinstance(schema, Mapping) else None
        if is_string(schema) or string_enum(schema) is not None:
            kind = '"string"'
        elif isinstance(t, str) and t in _K3_TYPES:
            kind = _lit(_K3_TYPES[t])
        else:
            kind = "/[a-z]{1,8}/"
        open_, type_, sep, close = K3_ARGUMENT
        type_q = _lit(type_)
        head = f"{g.m(open_)} {key} {type_q} {kind} {g.m(sep)}"
        return f"{head} {values.until_closer(schema, close)}"
    if family == "minimax_m3":
        return _m3_param(g, key, schema, 0)
    raise AssertionError(family)


def _m3_param(g, key: str, schema, depth: int) -> str:
    """`NS<K>V NS</K>`: an object's keys and a list's items nested as tags (3 levels)."""
    open_ = f"{g.m(NS + '<')} {key} {_lit('>')}"
    if not key.startswith('"'):  # any name: its value as free text
        return f"{open_} {g.until(NS + '</')} {key} {_lit('>')}"
    closer = NS + "</" + key[1:-1] + ">"
    t = schema.get("type") if isinstance(schema, Mapping) else None
    if depth < 3 and t == "object" and isinstance(schema.get("properties"), Mapping):
        props, required = schema["properties"], set(schema.get("required", ()))
        inner = " ".join(
            (lambda rule: rule if k in required else f"({rule})?")(
                _m3_param(g, _lit(k), s, depth + 1)
            )
            for k, s in props.items()
        )
        return f"{open_} {inner} {g.m(closer)}"
    if depth < 3 and t == "array" and isinstance(schema.get("items"), Mapping):
        item = g.define("item", _m3_param(g, _lit("item"), schema["items"], depth + 1))
        return f"{open_} {item}* {g.m(closer)}"
    return f"{open_} {Values(g, 'minimax').until_closer(schema, closer)}"
