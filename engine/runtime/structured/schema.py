"""What every grammar is made of: the Grammar a request carries, and the checks.

`Grammar` is llguidance Lark text and its cache key; `GrammarError` the client's
fault, named. `check_schema` refuses the JSON-schema keywords llguidance cannot
enforce, naming each with its path (a JSON pointer); `validate` is llguidance's own
check (its message gets the path found by looking the named key up in the schema);
`compile_error` says why a grammar does not compile for a tokenizer. `closed` is a
schema with its objects closed (OpenAI's strict mode).

The builders (engine.runtime.structured.grammar, .tools) use these. Plain Python
(json, hashlib; llguidance only to check a grammar): no MLX.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

WHITESPACE = r"[\x20\x0A\x0D\x09]{0,8}"  # at most 8 whitespace characters between JSON tokens
TOOL_CHOICES = ("auto", "required", "none", "function")
# The markers matched as single tokens when no tokenizer says otherwise.
SPECIAL_MARKERS = frozenset(("<tool_call>", "</tool_call>", "<think>", "</think>"))
# The markers a tokenizer holds as added tokens: text -> token id (markup.token_markers),
# or their texts alone (named in a grammar as `<text>`).
Markers = Mapping[str, int] | frozenset[str]

# Keywords llguidance cannot enforce (it refuses them); the walk refuses them first, with
# their path.
UNSUPPORTED = frozenset(
    {
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
    }
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("additionalProperties", "items", "additionalItems")


class GrammarError(ValueError):
    """A constraint the engine cannot enforce, or one that is malformed: the caller's fault
    (the front end answers INVALID_ARGUMENT / 400 with this message)."""


@dataclass(frozen=True)
class Grammar:
    """What one request's output is held to: llguidance Lark text, and its cache key."""

    lark: str
    kind: str  # json_schema | json_object | tools:<choice> | lark (for logs and figures)
    optional: bool = False  # the engine's own (lazy auto): dropped, never failed, if it fails

    @property
    def key(self) -> str:
        """The compiled grammar's cache key: the hash of its text."""
        return hashlib.sha256(self.lark.encode()).hexdigest()


def check_schema(schema: Any, where: str = "schema") -> None:
    """Refuse what the engine cannot enforce, naming the keyword and its path."""
    for path, node in _subschemas(schema, "#"):
        if isinstance(node, bool):
            continue
        if not isinstance(node, Mapping):
            raise GrammarError(
                f"{where}: the schema at {path} must be an object or a boolean, "
                f"got {type(node).__name__}"
            )
        for key in sorted(UNSUPPORTED & set(node)):
            raise GrammarError(
                f"{where}: keyword {key!r} at {path}/{key} is not supported "
                "(the engine cannot enforce it)"
            )
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            raise GrammarError(
                f"{where}: $ref {ref!r} at {path}/$ref is not supported (only references "
                "inside the schema, '#/...')"
            )


def _subschemas(schema: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(JSON pointer, subschema) of every schema inside `schema`, itself first."""
    stack = [(path, schema)]
    while stack:
        path, node = stack.pop()
        yield path, node
        if not isinstance(node, Mapping):
            continue
        for key in _SCHEMA_MAPS:
            children = node.get(key)
            if isinstance(children, Mapping):
                stack += [(f"{path}/{key}/{_escape(k)}", v) for k, v in children.items()]
        for key in _SCHEMA_LISTS:
            children = node.get(key)
            if isinstance(children, list):
                stack += [(f"{path}/{key}/{i}", v) for i, v in enumerate(children)]
        for key in _SCHEMA_ONE:
            child = node.get(key)
            if isinstance(child, list):  # draft-4 tuple items
                stack += [(f"{path}/{key}/{i}", v) for i, v in enumerate(child)]
            elif isinstance(child, (Mapping, bool)) and key in node:
                stack.append((f"{path}/{key}", child))


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def closed(schema: Mapping) -> dict:
    """A copy of `schema` whose objects allow no keys beyond their properties, unless they
    say what else they allow (OpenAI's strict mode)."""

    def close(node):
        if isinstance(node, list):
            return [close(v) for v in node]
        if not isinstance(node, Mapping):
            return node
        out = {k: close(v) for k, v in node.items()}
        is_object = out.get("type") == "object" or "properties" in out
        if is_object and "additionalProperties" not in out and "patternProperties" not in out:
            out["additionalProperties"] = False
        return out

    return close(schema)


# ----------------------------------------------------------- the backstop ----


def validate(grammar: Grammar, schema: Any, where: str) -> None:
    """llguidance's own check: what the walk did not refuse and it cannot do is refused here,
    with the path of the named key when it can be found in `schema`."""
    from llguidance import LLMatcher

    try:
        text = LLMatcher.grammar_from_lark(grammar.lark)
        failed, messages = LLMatcher.validate_grammar_with_warnings(text, None)
    except Exception as e:  # malformed beyond its parser's reach
        raise GrammarError(f"{where}: {e}") from None
    if failed:
        message = (messages[0] if messages else "refused by the grammar engine").split("\n")[0]
        message = re.sub(r"^at \d+\(\d+\): ", "", message)  # its place in the grammar text
        path = _locate(schema, message)
        raise GrammarError(f"{where}: {message}" + (f" (at {path})" if path else ""))


def compile_error(grammar: Grammar, tokenizer) -> str:
    """Why `grammar` does not compile against llguidance's `tokenizer` ("" when it does):
    a special token it names that the vocabulary lacks, for one."""
    from llguidance import LLMatcher

    try:
        failed, messages = LLMatcher.validate_grammar_with_warnings(
            LLMatcher.grammar_from_lark(grammar.lark), tokenizer
        )
    except Exception as e:
        return str(e).split("\n")[0]
    if not failed:
        return ""
    message = (messages[0] if messages else "refused by the grammar engine").split("\n")[0]
    return re.sub(r"^at \d+\(\d+\): ", "", message)


def _locate(schema: Any, message: str) -> str:
    """The JSON pointer of the first key or format the message names, if any."""
    if schema is None:
        return ""
    for path, node in _subschemas(schema, "#"):
        if not isinstance(node, Mapping):
            continue
        for key, value in node.items():
            if f'"{key}"' in message:
                return f"{path}/{key}"
            if key == "format" and isinstance(value, str) and value in message:
                return f"{path}/format"
            if key == "pattern" and isinstance(value, str) and "regex" in message:
                return f"{path}/pattern"
    return ""
