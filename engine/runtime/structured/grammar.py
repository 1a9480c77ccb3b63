"""What a constrained request asks for, as one llguidance grammar: JSON schemas and tool calls.

A request may hold its output to a grammar (`Grammar`, carried by the
GenerationRequest): a JSON schema (chat-completions `response_format`,
Responses `text.format`), a `tool_choice` over its tools (OpenAI's
required / named / none / auto, Anthropic's any / tool), or a grammar in
llguidance's Lark syntax given as is (gRPC). This module is the one way in:
it builds the schema grammars and hands out the tool grammars (built in
engine.runtime.structured.tools) and the checks (engine.runtime.structured.schema);
compiling a grammar against the tokenizer and matching tokens is
engine.runtime.structured.matcher's.

Never silent: a JSON-schema keyword the engine cannot enforce is refused
(`GrammarError`) naming the keyword and its path in the schema (a JSON
pointer); llguidance's own check is the backstop.

Strict schemas (`strict: true`) close every object that does not say
otherwise (`additionalProperties: false`), as OpenAI's strict mode does: an
open object would let the model add keys. Whitespace between JSON tokens is
bounded, so a model at a high temperature cannot pad forever.

Tool calls (`tool_grammar`, built in engine.runtime.structured.tools from each
family's markup in engine.runtime.structured.markup) are written in the model's
own markup. A marker the tokenizer holds as one added token (`markers`) is
matched as that token, which free text can never contain; one it spells in
ordinary pieces is matched as text. The end of reasoning (`</think>`, or the
family's own, for a `-thinking` format) is matched the same way.

`Grammar.optional` marks a grammar the engine adds on its own (the lazy `auto`
tool grammar): one that does not compile for the served tokenizer leaves the
request unconstrained (counted and logged). A grammar the client asked for
(`required`, a named tool, `none`, a response format, a Lark text) that does
not compile is the client's error.

Plain Python (json, hashlib; llguidance only to check a grammar): no MLX.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from engine.runtime.structured.schema import (
    SPECIAL_MARKERS,
    TOOL_CHOICES,
    UNSUPPORTED,
    WHITESPACE,
    Grammar,
    GrammarError,
    Markers,
    check_schema,
    closed,
    compile_error,
    validate,
)
from engine.runtime.structured.tools import reasoning, tool_grammar

__all__ = [
    "SPECIAL_MARKERS",
    "TOOL_CHOICES",
    "UNSUPPORTED",
    "WHITESPACE",
    "Grammar",
    "GrammarError",
    "Markers",
    "check_schema",
    "compile_error",
    "json_object_grammar",
    "lark_grammar",
    "schema_grammar",
    "tool_grammar",
]


# ------------------------------------------------------------- JSON schemas ----


def schema_grammar(
    schema: Any,
    *,
    strict: bool = False,
    output_format: str = "plain",
    where: str = "schema",
    markers: Markers = SPECIAL_MARKERS,
) -> Grammar:
    """The whole output is one JSON value valid for `schema`. Raises GrammarError."""
    if not isinstance(schema, Mapping):
        raise GrammarError(f"{where} must be a JSON object, got {type(schema).__name__}")
    check_schema(schema, where)
    body = closed(schema) if strict else dict(schema)
    body["x-guidance"] = {"whitespace_pattern": WHITESPACE}
    lark = _with_reasoning(f"%json {json.dumps(body)}", output_format, markers)
    grammar = Grammar(lark, "json_schema")
    validate(grammar, schema, where)
    return grammar


def json_object_grammar(
    output_format: str = "plain", markers: Markers = SPECIAL_MARKERS
) -> Grammar:
    """`response_format: json_object`: any JSON object."""
    body = {"type": "object", "x-guidance": {"whitespace_pattern": WHITESPACE}}
    lark = _with_reasoning(f"%json {json.dumps(body)}", output_format, markers)
    return Grammar(lark, "json_object")


def lark_grammar(text: str, where: str = "grammar") -> Grammar:
    """A grammar in llguidance's Lark syntax, as given (gRPC's `constraint.lark`)."""
    if not text.strip():
        raise GrammarError(f"{where} is empty")
    grammar = Grammar(text, "lark")
    validate(grammar, None, where)
    return grammar


def _with_reasoning(body: str, output_format: str, markers) -> str:
    """The start rule: `body`, after the format's reasoning where its output opens in
    one (a `-thinking` format's free text up to `</think>` or the family's own end;
    harmony's analysis messages and final channel)."""
    start = reasoning(body, output_format, markers)
    return f"start: {body}\n" if start is None else start
