"""A request's `constraint` field (proto) -> the Grammar its output is held to.

It reads the proto's Constraint (a JSON schema, `json_object`, a Lark grammar,
or a tool choice over the request's tools) and the model's output format (whose
tool-call markup the tool grammars match), and builds the grammar with
engine.runtime.structured.grammar. What cannot be enforced is an InvalidRequest naming
the field, the keyword and its path in the schema, so the caller gets
INVALID_ARGUMENT (the bridge's 400) before any work is done.

`GrammarCheck` compiles each distinct grammar once against the served
tokenizer (llguidance's view of it), before any cache work: a grammar the
client asked for that does not compile is an InvalidRequest naming why; one
the engine added on its own (`Grammar.optional`, the lazy `auto` tool grammar)
is dropped instead, counted and logged, and the request runs unconstrained.
Matching tokens is the model actor's.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from engine.config import Limits
from engine.proto import engine_pb2
from engine.runtime.structured.grammar import (
    SPECIAL_MARKERS,
    Grammar,
    GrammarError,
    Markers,
    compile_error,
    json_object_grammar,
    lark_grammar,
    schema_grammar,
    tool_grammar,
)
from engine.runtime.structured.matcher import llguidance_tokenizer
from engine.server.errors import InvalidRequest
from engine.server.security.limits import DEFAULT_LIMITS, parse_json


def to_grammar(
    c: engine_pb2.Constraint,
    tools: tuple[dict, ...] | None,
    output_format: str,
    limits: Limits = DEFAULT_LIMITS,
    markers: Markers = SPECIAL_MARKERS,
    reasoning: bool = True,
) -> Grammar | None:
    """The grammar of `c`, or None when it holds nothing. `reasoning` False: the request
    switched the reasoning off (`enable_thinking` false), so its generation prompt closed
    the reasoning block and the output opens none. Raises InvalidRequest."""
    which = c.WhichOneof("kind")
    if not reasoning:
        output_format = output_format.removesuffix("-thinking")
    try:
        if which is None:
            return None
        if which == "json_schema":
            schema = parse_json("constraint.json_schema", c.json_schema, limits)
            return schema_grammar(
                schema,
                strict=c.strict,
                output_format=output_format,
                where="json_schema",
                markers=markers,
            )
        if which == "json_object":
            return json_object_grammar(output_format, markers) if c.json_object else None
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
            markers=markers,
            reasoning=reasoning,
        )
    except GrammarError as e:
        raise InvalidRequest(str(e)) from None


class GrammarCheck:
    """Grammars compiled once against the served tokenizer (module doc)."""

    def __init__(self, tokenizer, vocab_size: int, failed: Callable[[str, str], None], keep=256):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.failed = failed  # (kind, error): counts and logs a dropped optional grammar
        self.errors: OrderedDict[str, str] = OrderedDict()  # grammar key -> "" or its error
        self.keep = keep
        self._ll = None

    def admit(self, grammar: Grammar | None) -> Grammar | None:
        """`grammar` if it compiles; None for an optional one that does not; else
        InvalidRequest naming why."""
        if grammar is None:
            return None
        error = self.errors.get(grammar.key)
        if error is None:
            error = compile_error(grammar, self._tokenizer())
            self.errors[grammar.key] = error
            while len(self.errors) > self.keep:
                self.errors.popitem(last=False)
        if not error:
            return grammar
        if grammar.optional:
            self.failed("grammar", f"{grammar.kind}: {error}")
            return None
        raise InvalidRequest(f"the {grammar.kind} grammar does not compile for this model: {error}")

    def _tokenizer(self):
        if self._ll is None:
            self._ll = llguidance_tokenizer(self.tokenizer, self.vocab_size)
        return self._ll
