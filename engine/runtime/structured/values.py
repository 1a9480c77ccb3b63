"""Tool arguments written as parameters in a family's own markup, as Lark rules.

`Values(lark, style).params(schema)`: the parameters of an XML-ish family
(`qwen_xml` `<parameter=K>\\nV\\n</parameter>\\n`, `minimax`
`<parameter name="K">V</parameter>`, `dsml` `<｜DSML｜parameter name="K"
string="true|false">V</｜DSML｜parameter>`, `glm` `<arg_key>K</arg_key><arg_value>V</arg_value>`,
`seed` `<parameter=K>V</parameter>\\n`).
`kwargs(schema, sep, eq)`: keyword arguments (`python` `k="v"`, `gemma` `k:<|"|>v<|"|>`).

One parameter per declared property, in the declared order, the required ones
present; a value by its JSON type: a string as free text up to the closing tag
(minLength/maxLength held; pattern and format not), an enum of strings as one of
them, anything else as the JSON the template writes (`tojson`). A schema that
declares no properties takes any names, values as free text (XML-ish) or JSON.

It knows the markup of parameters, nothing of calls (engine.runtime.structured.tools).
"""

from __future__ import annotations

import json
from typing import Mapping

from engine.runtime.structured.schema import closed

_XML = {  # style -> (before the name, between name and value, after the value)
    "qwen_xml": ("<parameter=", ">\n", "\n</parameter>\n"),
    "minimax": ('<parameter name="', '">', "</parameter>"),
    "glm": ("<arg_key>", "</arg_key>", "</arg_value>"),
    "seed": ("<parameter=", ">", "</parameter>\n"),
}
ANY_NAME = "/[A-Za-z_][A-Za-z0-9_.-]{0,63}/"


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _is_string(schema) -> bool:
    return isinstance(schema, Mapping) and schema.get("type") == "string" and "enum" not in schema


def _string_enum(schema) -> list[str] | None:
    if not isinstance(schema, Mapping):
        return None
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values and all(isinstance(v, str) for v in values):
        return list(values)
    return None


class Values:
    """The parameter rules of one style, added to a grammar (`lark`: tools.Lark)."""

    def __init__(self, lark, style: str):
        self.g = lark
        self.style = style

    # ---- XML-ish ----

    def params(self, schema: Mapping) -> str:
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        if not props:
            return f"{self.g.define('param', self._param(ANY_NAME, {}))}*"
        required = set(schema.get("required", ()))
        parts = []
        for key, sub in props.items():
            rule = self.g.define("param", self._param(_lit(key), sub))
            parts.append(rule if key in required else f"{rule}?")
        return " ".join(parts)

    def _param(self, key: str, schema) -> str:
        g = self.g
        if self.style == "dsml":  # string values are text (string="true"), others JSON
            open_, close = '"<｜DSML｜parameter name=\\""', "</｜DSML｜parameter>"
            textual = _is_string(schema) or not schema or _string_enum(schema) is not None
            value = self._value(schema, close)
            kind = '"\\" string=\\"true\\">"' if textual else '"\\" string=\\"false\\">"'
            return f'{open_} {key} {kind} {value} "\\n"'
        before, between, after = _XML[self.style]
        if self.style == "glm":
            head = f'{g.m("<arg_key>")} {key} {g.m("</arg_key>")} "\\n"? {g.m("<arg_value>")}'
            return f'{head} {self._value(schema, after)} "\\n"?'
        tail = '"\\n"?' if self.style == "minimax" else ""
        return f"{_lit(before)} {key} {_lit(between)} {self._value(schema, after)} {tail}"

    def _value(self, schema, closer: str) -> str:
        """A value, then `closer`."""
        g = self.g
        enum = _string_enum(schema)
        if enum is not None:
            return f"({' | '.join(map(_lit, enum))}) {g.m(closer)}"
        if _is_string(schema) or not schema:
            return self._text(schema, closer)
        return f"{self._json(schema)} {g.m(closer)}"

    def _text(self, schema, closer: str) -> str:
        lo = int(schema.get("minLength", 0)) if isinstance(schema, Mapping) else 0
        hi = schema.get("maxLength") if isinstance(schema, Mapping) else None
        return self.g.until(closer, lo, None if hi is None else int(hi))

    def _json(self, schema) -> str:
        return self.g.json(closed(schema) if isinstance(schema, Mapping) else {})

    # ---- keyword arguments ----

    def kwargs(self, schema: Mapping, sep: str, eq: str) -> str:
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        if not props:
            pair = f"{ANY_NAME} {_lit(eq)} {self.value({})}"
            return f"({pair} ({_lit(sep)} {pair})*)?"
        required = set(schema.get("required", ()))
        pairs = [
            (self.g.define("kw", f"{_lit(k)} {_lit(eq)} {self.value(sub)}"), k in required)
            for k, sub in props.items()
        ]
        return self._seq(pairs, _lit(sep), 0, False)

    def _seq(self, pairs, sep: str, i: int, written: bool) -> str:
        """The arguments from the i-th on, in order, the required ones present, `sep`
        between two (`written`: one came before). "" where nothing is left."""
        if i == len(pairs):
            return ""
        pair, required = pairs[i]
        after = self._seq(pairs, sep, i + 1, True)
        if written:
            body = f"{sep} {pair} {after}" if required else f"({sep} {pair})? {after}"
        elif required:
            body = f"{pair} {after}"
        else:
            skip = self._seq(pairs, sep, i + 1, False)
            body = f"({pair} {after} | {skip})" if skip else f"({pair} {after})?"
        return self.g.define("kws", " ".join(body.split()))

    def value(self, schema) -> str:
        """One value as Python (`python`) or Gemma (`gemma`) writes it."""
        g = self.g
        t = schema.get("type") if isinstance(schema, Mapping) else None
        if self.style == "python":
            if t == "boolean":
                return '("True" | "False")'
            if t == "null":
                return '"None"'
            return self._json(schema)
        quote = '<|"|>'
        enum = _string_enum(schema)
        if enum is not None:
            return "(" + " | ".join(f"{g.m(quote)} {_lit(v)} {g.m(quote)}" for v in enum) + ")"
        if _is_string(schema):
            return f"{g.m(quote)} {self._text(schema, quote)}"
        if t == "object" and isinstance(schema.get("properties"), Mapping):
            return f'"{{" {self.kwargs(schema, ",", ":")} "}}"'
        if t == "array" and isinstance(schema.get("items"), Mapping):
            item = g.define("item", self.value(schema["items"]))
            return f'"[" ({item} ("," {item})*)? "]"'
        if t in ("integer", "number", "boolean", "null"):
            return self._json(schema)
        return f"({g.m(quote)} {self._text({}, quote)} | {self._json(schema)})"
