"""Tool grammars of the families whose calls sit between tags of their own, the parts
engine.runtime.structured.tools does not build from its common shapes.

- `seed` arguments (Seed-OSS): `\\n<function=NAME>\\n` then `<parameter=K>V</parameter>\\n`
  per parameter (engine.runtime.structured.values, style `seed`), `</function>\\n`;
- `pylist` shape (LFM2): one pythonic list `[NAME(k=v), ...]` after the opener, then its
  closer;
- `gigachat` shape (GigaChat 3 and 3.1): the call is a message of its own, one per turn.
  3.1 writes the answer's text, `<|function_call|>{"name": …, "arguments": {…}}`;
  3 the text, `<|message_sep|>`, then `\\n\\nfunction call<|role_sep|>\\n{…}`; either
  may end with `<|message_sep|>` and blank lines;
- `solar` shape (Solar Open): messages of their own after the generation prompt's
  `<|begin|>assistant`: reasoning `<|think|>…<|end|>`, an answer `<|content|>…<|end|>`,
  calls `<|tool_calls|>` then `<|tool_call:begin|>ID<|tool_call:name|>NAME
  <|tool_call:args|>{…}<|tool_call:end|>` each (ID ten lowercase letters and digits, as
  the template asks), `<|calls|>`; a message after the first opens with
  `<|begin|>assistant`.

It takes the grammar being built (`tools.Lark`: markers as tokens or text, named
rules) and the family's row of engine.runtime.structured.markup; it knows nothing of
llguidance or MLX.
"""

from __future__ import annotations

import json
import re
from typing import Mapping

from engine.runtime.structured.schema import closed
from engine.runtime.structured.values import Values

SHAPES = ("pylist", "gigachat", "solar")  # the start rules built here (tools._start)
_MS, _FC, _RS = "<|message_sep|>", "<|function_call|>", "<|role_sep|>"


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _regex(text: str) -> str:
    return re.escape(text).replace("/", "\\/").replace("\\\n", "\\n")


def _call_object(name: str, params: Mapping) -> dict:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": closed(params)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def call(g, markup, name: str, params: Mapping) -> str:
    """One call of tool `name` after the family's opener (`calls` shape): Seed-OSS's."""
    assert markup.args == "seed", markup
    head = f'"\\n<function=" {_lit(name)} ">\\n"'
    body = Values(g, "seed").params(params)
    return f'{head} {body} "</function>\\n" {g.m(markup.closer)}'


def after_opener(g, markup, calls: Mapping, one: bool) -> str:
    """What follows the opener of a `pylist` family: the list of calls and the closer."""
    assert markup.shape == "pylist", markup
    values = Values(g, "python")
    body = " | ".join(f'{_lit(n)} "(" {values.kwargs(s, ", ", "=")} ")"' for n, s in calls.items())
    item = g.define("call", body)
    many = item if one else f"{item} ({_lit(', ')} {item})*"
    return f'"[" {many} "]" {g.m(markup.closer)}'


def _text_without(g, *markers: str) -> str:
    """Free text that holds none of `markers` (those that are added tokens it never can)."""
    spelled = [_regex(m) for m in markers if not g.token(m)]
    if not spelled:
        return g.define("TEXT", "/(.|\\n)*/")
    return g.define("TEXT", f"/(.|\\n)*/ & ~/(.|\\n)*({'|'.join(spelled)})(.|\\n)*/")


def _until(g, closer: str, other: str) -> str:
    """Free text up to `closer` that holds no `other` marker, then `closer`."""
    if g.token(closer):
        return f"{_text_without(g, other)} {g.m(closer)}"
    if g.token(other):
        return g.until(closer)
    c, o = _regex(closer), _regex(other)
    body = f"/(.|\\n)*{c}/ & ~/(.|\\n)*{c}(.|\\n)+/ & ~/(.|\\n)*{o}(.|\\n)*/"
    return g.define("UNTIL", body)


def start(g, markup, calls: Mapping, choice: str, one: bool) -> str:
    """The start rule's body of a `gigachat` or `solar` family (module doc). Text that a
    marker ends is one lexeme up to it where the marker is spelled in text (`g.until`)."""
    if markup.shape == "solar":
        return _solar(g, calls, choice, one)
    assert markup.shape == "gigachat", markup
    ms = g.m(_MS)
    tail = g.define("BLANK", "/\\n{0,2}/")
    end = g.define("end", f"({ms} {tail})?")
    if choice == "none" or not calls:
        return f"{_text_without(g, _MS)} | {g.until(_MS)} {tail}"
    body = g.define("call", " | ".join(g.json(_call_object(n, s)) for n, s in calls.items()))
    if markup.opener == _FC:  # GigaChat 3.1: the call after the answer's text
        if choice in ("required", "function"):
            return f"{g.m(_FC)} {body} {end}"
        text = _text_without(g, _FC, _MS)
        return f"{text} | {_until(g, _FC, _MS)} {body} {end} | {_until(g, _MS, _FC)} {tail}"
    # GigaChat 3: the call is a `function call` message after the answer's
    message = g.define("message", f'"\\n\\nfunction call" {g.m(_RS)} "\\n" {body} {end}')
    if choice in ("required", "function"):
        return f"{ms} {message}"
    return f"{_text_without(g, _MS)} | {g.until(_MS)} ({message} | {tail})"


def _solar(g, calls: Mapping, choice: str, one: bool) -> str:
    begin = g.define("header", f'{g.m("<|begin|>")} "assistant"')
    think = g.define("reasoning", f"{g.m('<|think|>')} {g.until('<|end|>')} {begin}")
    lead = f"{begin}? {think}?"  # (a -thinking prompt's reasoning ends at the header)
    content = g.m("<|content|>")
    if choice == "none" or not calls:
        return f"{lead} {content} ({_text_without(g, '<|end|>')} | {g.until('<|end|>')})"
    args = {n: g.json(closed(s)) for n, s in calls.items()}
    one_call = g.define(
        "call",
        " | ".join(
            f"{g.m('<|tool_call:begin|>')} /[a-z0-9]{{10}}/ {g.m('<|tool_call:name|>')} "
            f"{_lit(n)} {g.m('<|tool_call:args|>')} {a} {g.m('<|tool_call:end|>')}"
            for n, a in args.items()
        ),
    )
    many = one_call if one else f"{one_call}+"
    block = g.define("calls", f"{g.m('<|tool_calls|>')} {many} {g.m('<|calls|>')}?")
    if choice in ("required", "function"):
        return f"{lead} {block}"
    answer = f"{_text_without(g, '<|end|>')} | {g.until('<|end|>')} ({begin} {block})?"
    return f"{lead} ({block} | {content} ({answer}))"
