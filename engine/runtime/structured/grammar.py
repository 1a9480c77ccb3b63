"""What a constrained request asks for, as one llguidance grammar: JSON schemas and tool calls.

A request may hold its output to a grammar (`Grammar`, carried by the
GenerationRequest): a JSON schema (chat-completions `response_format`,
Responses `text.format`), a `tool_choice` over its tools (OpenAI's
required / named / none / auto, Anthropic's any / tool), or a grammar in
llguidance's Lark syntax given as is (gRPC). This module builds the grammar's
text and checks it; compiling it against the tokenizer and matching tokens is
engine.runtime.structured.matcher's.

Never silent: a JSON-schema keyword the engine cannot enforce is refused
(`GrammarError`) naming the keyword and its path in the schema (a JSON
pointer). The walk here knows the keywords llguidance refuses; llguidance's
own check is the backstop, and its message gets the path found by looking
the named key up in the schema.

Strict schemas (`strict: true`) close every object that does not say
otherwise (`additionalProperties: false`), as OpenAI's strict mode does: an
open object would let the model add keys. Whitespace between JSON tokens is
bounded, so a model at a high temperature cannot pad forever.

Tool calls are written in the model's own markup (its output format, as
engine.server.prompts.output_format decides it). The `qwen` family (Qwen, Hermes, the
embedded model) writes `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`.
A marker the tokenizer holds as one added token (`markers`, from
engine.server.prompts.output_format.special_markers) is matched as that token, which
free text can never contain; a marker it spells in ordinary pieces is matched
as text, and the free text around calls is then text without the marker (a
lexeme that ends at the marker's first occurrence, `_until`). Either way `auto`
is lazy (free text until the model opens a call, then the call held to the
tools' schemas) and `none` forbids calls. The end of reasoning (`</think>`, for
a `-thinking` format) is matched the same way. Other families have no tool
grammar: asking them for `required` or a named tool is refused, `auto` runs
unconstrained.

`Grammar.optional` marks a grammar the engine adds on its own (the lazy `auto`
tool grammar): one that does not compile for the served tokenizer leaves the
request unconstrained (counted and logged). A grammar the client asked for
(`required`, a named tool, `none`, a response format, a Lark text) that does
not compile is the client's error.

Plain Python (json, hashlib; llguidance only to check a grammar): no MLX.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

WHITESPACE = r"[\x20\x0A\x0D\x09]{0,8}"  # at most 8 whitespace characters between JSON tokens
TOOL_CHOICES = ("auto", "required", "none", "function")
TOOL_OPEN, TOOL_CLOSE, THINK_CLOSE = "<tool_call>", "</tool_call>", "</think>"
# The markers matched as single tokens when no tokenizer says otherwise.
SPECIAL_MARKERS = frozenset((TOOL_OPEN, TOOL_CLOSE, "<think>", THINK_CLOSE))

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
    """A constraint on one request's output: llguidance Lark text, and its cache key."""

    lark: str
    kind: str  # json_schema | json_object | tools:<choice> | lark (for logs and figures)
    optional: bool = False  # the engine's own (lazy auto): dropped, never failed, if it fails

    @property
    def key(self) -> str:
        """The compiled grammar's cache key: the hash of its text."""
        return hashlib.sha256(self.lark.encode()).hexdigest()


# ------------------------------------------------------------- JSON schemas ----


def schema_grammar(
    schema: Any,
    *,
    strict: bool = False,
    output_format: str = "plain",
    where: str = "schema",
    markers: frozenset[str] = SPECIAL_MARKERS,
) -> Grammar:
    """The whole output is one JSON value valid for `schema`. Raises GrammarError."""
    if not isinstance(schema, Mapping):
        raise GrammarError(f"{where} must be a JSON object, got {type(schema).__name__}")
    check_schema(schema, where)
    body = _closed(schema) if strict else dict(schema)
    body["x-guidance"] = {"whitespace_pattern": WHITESPACE}
    lark = _with_reasoning(f"%json {json.dumps(body)}", output_format, markers)
    grammar = Grammar(lark, "json_schema")
    _validate(grammar, schema, where)
    return grammar


def json_object_grammar(
    output_format: str = "plain", markers: frozenset[str] = SPECIAL_MARKERS
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
    _validate(grammar, None, where)
    return grammar


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


def _closed(schema: Mapping) -> dict:
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


# --------------------------------------------------------------- tool calls ----


def tool_grammar(
    tools: Sequence[Mapping[str, Any]],
    choice: str = "auto",
    name: str = "",
    *,
    parallel: bool = True,
    output_format: str = "plain",
    where: str = "tool_choice",
    markers: frozenset[str] = SPECIAL_MARKERS,
) -> Grammar | None:
    """The output a `tool_choice` allows over `tools` (OpenAI style definitions).

    - `auto`: free text, and calls (lazy: held to the tools' schemas once opened);
    - `required` (Anthropic `any`): one call or more, nothing else;
    - `function` with `name` (Anthropic `tool`): calls of that tool only;
    - `none`: text only, no call markup.
    `parallel` false: at most one call. None where nothing is to be held: `auto` for a
    family without a tool grammar, or no tools with `auto`/`none`. Raises GrammarError.
    """
    if choice not in TOOL_CHOICES:
        raise GrammarError(
            f"{where} must be one of {', '.join(TOOL_CHOICES)} or name a function, got {choice!r}"
        )
    calls = _tool_schemas(tools, where)
    if choice == "function":
        if name not in calls:
            known = ", ".join(sorted(calls)) or "none"
            raise GrammarError(f"{where} names tool {name!r}, which is not in tools ({known})")
        calls = {name: calls[name]}
    if choice in ("required", "function") and not calls:
        raise GrammarError(f"{where} {choice!r} needs tools")
    family = output_format.removesuffix("-thinking")
    if family != "qwen":
        if choice in ("required", "function"):
            raise GrammarError(
                f"{where} {choice!r}: the model's output format {output_format!r} has no "
                "tool-call grammar here (only the qwen family's)"
            )
        return None
    if choice == "auto" and not calls:
        return None
    body = None
    if calls:
        body = {"anyOf": [_call_schema(n, s) for n, s in calls.items()]}
        body["x-guidance"] = {"whitespace_pattern": WHITESPACE}
    as_token = TOOL_OPEN in markers
    if choice == "auto" and not as_token:  # free text ends where a call opens
        start = "start: (OPEN call_body)* TEXT" if parallel else "start: (OPEN call_body)? TEXT"
    else:
        start = {
            ("auto", True): "start: TEXT (call TEXT)*",
            ("auto", False): "start: TEXT (call TEXT)?",
            ("required", True): 'start: call ("\\n" call)*',
            ("required", False): "start: call",
            ("function", True): 'start: call ("\\n" call)*',
            ("function", False): "start: call",
            ("none", True): "start: TEXT",
            ("none", False): "start: TEXT",
        }[(choice, parallel)]
    lines = ["%llguidance {}", start]
    if body is not None:
        lines.append(f"call: {_marker(TOOL_OPEN, markers)} call_body")
        close = _marker(TOOL_CLOSE, markers)
        lines.append(f'call_body: "\\n" %json {json.dumps(body)} "\\n" {close}')
    if as_token:
        lines.append("TEXT: /(.|\\n)*/")
    else:
        lines += [_until("OPEN", TOOL_OPEN), _without("TEXT", TOOL_OPEN)]
    lines.append("")
    kind = f"tools:{choice}" + ("" if parallel else ":single")
    lark = "\n".join(lines)
    if output_format.endswith("-thinking"):  # the output starts inside the reasoning block
        if THINK_CLOSE in markers:
            lark = lark.replace("start:", "start: THINK </think> body\nbody:", 1)
            lark += "THINK: /(.|\\n)*/\n"
        else:
            lark = lark.replace("start:", "start: THINK_END body\nbody:", 1)
            lark += _until("THINK_END", THINK_CLOSE) + "\n"
    grammar = Grammar(lark, kind, optional=choice == "auto")
    _validate(grammar, {"tools": list(tools)}, where)
    return grammar


def _marker(text: str, markers: frozenset[str]) -> str:
    """A marker in Lark: the special token where the tokenizer holds one, else its text."""
    return text if text in markers else json.dumps(text)


def _regex(text: str) -> str:
    """`text` as a literal inside a Lark /regex/ (Rust regex syntax, `/` escaped)."""
    return re.escape(text).replace("/", "\\/")


def _until(name: str, marker: str) -> str:
    """A lexeme: any text up to and including the first `marker` (text, not a token)."""
    m = _regex(marker)
    return f"{name}: /(.|\\n)*{m}/ & ~/(.|\\n)*{m}(.|\\n)+/"


def _without(name: str, marker: str) -> str:
    """A lexeme: any text that does not contain `marker`."""
    return f"{name}: /(.|\\n)*/ & ~/(.|\\n)*{_regex(marker)}(.|\\n)*/"


def _tool_schemas(tools: Sequence[Mapping[str, Any]], where: str) -> dict[str, Mapping]:
    """name -> parameters schema, each checked (its path names the tool)."""
    out: dict[str, Mapping] = {}
    for i, tool in enumerate(tools or ()):
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise GrammarError(f"tools[{i}] has no function name")
        params = fn.get("parameters", fn.get("input_schema", {"type": "object"}))
        check_schema(params, f"tools[{i}].function.parameters")
        out[fn["name"]] = params
    return out


def _call_schema(name: str, params: Mapping) -> dict:
    """One call in Qwen's markup: {"name": const, "arguments": its parameters}, held as a
    strict schema (no keys beyond the declared properties, unless the schema allows them):
    a tool reads the keys it declared."""
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": _closed(params)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _with_reasoning(body: str, output_format: str, markers: frozenset[str]) -> str:
    """A `-thinking` family's output opens inside its reasoning block: free text up to
    `</think>`, then the constrained body."""
    if not output_format.endswith("-thinking"):
        return f"start: {body}\n"
    if THINK_CLOSE not in markers:
        return f"start: THINK_END WS {body}\n{_until('THINK_END', THINK_CLOSE)}\nWS: /[\\n ]*/\n"
    return f"start: THINK </think> WS {body}\nTHINK: /(.|\\n)*/\nWS: /[\\n ]*/\n"


# ----------------------------------------------------------- the backstop ----


def _validate(grammar: Grammar, schema: Any, where: str) -> None:
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
