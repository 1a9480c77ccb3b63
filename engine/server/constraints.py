"""A request's `constraint` field (proto) -> the Grammar its output is held to.

It reads the proto's Constraint (a JSON schema, `json_object`, a Lark grammar,
or a tool choice over the request's tools) and the model's output format (whose
tool-call markup the tool grammars match), and builds the grammar with
engine.runtime.structured.grammar. What cannot be enforced is an InvalidRequest naming
the field, the keyword and its path in the schema, so the caller gets
INVALID_ARGUMENT (the bridge's 400) before any work is done. It knows no
tokenizer and no model: compiling is the model actor's.
"""

from __future__ import annotations

from engine.config import Limits
from engine.proto import engine_pb2
from engine.runtime.structured.grammar import (
    Grammar,
    GrammarError,
    json_object_grammar,
    lark_grammar,
    schema_grammar,
    tool_grammar,
)
from engine.server.errors import InvalidRequest
from engine.server.limits import DEFAULT_LIMITS, parse_json


def to_grammar(
    c: engine_pb2.Constraint,
    tools: tuple[dict, ...] | None,
    output_format: str,
    limits: Limits = DEFAULT_LIMITS,
) -> Grammar | None:
    """The grammar of `c`, or None when it holds nothing. Raises InvalidRequest."""
    which = c.WhichOneof("kind")
    try:
        if which is None:
            return None
        if which == "json_schema":
            schema = parse_json("constraint.json_schema", c.json_schema, limits)
            return schema_grammar(
                schema, strict=c.strict, output_format=output_format, where="json_schema"
            )
        if which == "json_object":
            return json_object_grammar(output_format) if c.json_object else None
        if which == "lark":
            return lark_grammar(c.lark, "constraint.lark")
        choice = c.tool_choice
        return tool_grammar(
            list(tools or ()),
            choice.mode or "auto",
            choice.name,
            parallel=not choice.single,
            output_format=output_format,
            where="tool_choice",
        )
    except GrammarError as e:
        raise InvalidRequest(str(e)) from None
