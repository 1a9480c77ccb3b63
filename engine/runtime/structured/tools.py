"""The grammar of a `tool_choice`: free text and calls in the served family's own markup.

`tool_grammar` builds one llguidance Lark grammar from the family's row in
engine.runtime.structured.markup and the tools' parameter schemas:

- `auto`: lazy. Free text until the family's opener, then the calls held to the
  tools' schemas, then free text again. Where the opener is an added token, free
  text can never hold it (llguidance keeps special tokens out of text); where it is
  spelled in ordinary pieces, free text is text without it, and a lexeme ending at its
  first occurrence opens the call (`Lark.until`/`Lark.text`).
- `required` (Anthropic `any`): one call or more and nothing else (but the reasoning);
- `function` with a name (Anthropic `tool`): one call of that tool, whatever
  `parallel` says (as vLLM's named function calling, whose output is that one
  call's arguments): a model that does not stop by itself stops after it;
- `none`: text only (the opener never starts);
- `parallel` false: one call.

Call bodies by the family's `args`: a JSON object held by its schema (strict: a
tool reads the keys it declared), or parameters in the family's markup, one per
declared property in the declared order (required ones present, optional ones
optional), each value by its JSON type: a string as free text up to the closing
tag (its minLength/maxLength held, a pattern or format not), an enum of strings as
one of them, anything else as JSON. A tool whose parameters declare no properties
takes any parameter names there.

A `-thinking` format starts inside the reasoning: free text up to the family's
`think_close`, then the grammar above. Harmony's reasoning is its `analysis`
channel (any number of analysis messages before the call or the final answer).

Families with no call markup (`plain`) have no grammar: `required` and a named
tool are refused naming the family; `auto` runs unconstrained. Llama 3's JSON,
harmony and GigaChat write one call per turn (their templates show no other):
`required` there is exactly one call. The tagged families' own parts (Seed-OSS's
parameters, LFM2's list, GigaChat's and Solar Open's messages) come from
engine.runtime.structured.tagged. Plain Python; llguidance only to check the grammar.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from engine.runtime.structured import markup as table
from engine.runtime.structured import tagged
from engine.runtime.structured.schema import (
    SPECIAL_MARKERS,
    TOOL_CHOICES,
    WHITESPACE,
    Grammar,
    GrammarError,
    check_schema,
    closed,
    validate,
)
from engine.runtime.structured.tag_tools import tag_start
from engine.runtime.structured.values import Values

INDENTED = r"[\x20\x0A\x0D\x09]{0,24}"  # Command R+'s calls are indented by 8 and 12
ANY = "/(.|\\n)*/"  # any text (never an added token: llguidance keeps those out)
_TOKEN_NAME = re.compile(r"^<[^<>\s\[\]]+>$")


class Lark:
    """Rules and lexemes of one grammar, markers written as tokens or text."""

    def __init__(self, markers):
        self.markers = markers
        self.lines: list[str] = []
        self.names: dict[str, str] = {}  # body -> rule / lexeme name

    def m(self, text: str) -> str:
        """A marker: its added token where the tokenizer has one, else its text (a text
        with added tokens inside, `]<]minimax[>[<tool_call>`, as its pieces)."""
        if isinstance(self.markers, Mapping) and text in self.markers:
            return text if _TOKEN_NAME.match(text) else f"<[{self.markers[text]}]>"
        if text in self.markers and _TOKEN_NAME.match(text):
            return text
        pieces = self.pieces(text)
        if len(pieces) > 1:
            return " ".join(self.m(p) for p in pieces)
        return lit(text)

    def token(self, text: str) -> bool:
        return text in self.markers

    def pieces(self, text: str) -> list[str]:
        """`text` cut around the markers inside it that the tokenizer holds as tokens."""
        if isinstance(self.markers, Mapping):
            tokens = list(self.markers)
        else:
            tokens = [k for k in self.markers if _TOKEN_NAME.match(k)]
        inner = sorted((k for k in tokens if k in text and k != text), key=len, reverse=True)
        if not inner:
            return [text]
        return [p for p in re.split("(" + "|".join(map(re.escape, inner)) + ")", text) if p]

    def define(self, prefix: str, body: str) -> str:
        """A named rule (lower-case prefix) or lexeme (upper-case), one per distinct body."""
        if body not in self.names:
            name = f"{prefix}_{len(self.names)}"
            self.names[body] = name
            self.lines.append(f"{name}: {body}")
        return self.names[body]

    def until(self, closer: str, lo: int = 0, hi: int | None = None) -> str:
        """Free text (lo..hi characters), then `closer`."""
        count = "*" if (lo, hi) == (0, None) else f"{{{lo},{'' if hi is None else hi}}}"
        head, *rest = [closer] if self.token(closer) else self.pieces(closer)
        if rest:  # a text with tokens inside: up to its first piece, then the rest
            return f"{self.until(head, lo, hi)} {' '.join(self.m(p) for p in rest)}"
        if self.token(closer):
            free = self.define("FREE", "/(.|\\n)" + count + "/")
            return f"{free} {self.m(closer)}"
        c = _regex(closer)
        return self.define("UNTIL", f"/(.|\\n){count}{c}/ & ~/(.|\\n)*{c}(.|\\n)+/")

    def text(self, opener: str) -> str:
        """Free text that never opens a call."""
        if not self.token(opener):  # a text with tokens inside: never its first piece
            opener = self.pieces(opener)[0]
        if self.token(opener):
            return self.define("TEXT", "/(.|\\n)*/")
        return self.define("TEXT", f"/(.|\\n)*/ & ~/(.|\\n)*{_regex(opener)}(.|\\n)*/")

    def json(self, schema: Mapping, whitespace: str = WHITESPACE) -> str:
        body = dict(schema)
        body["x-guidance"] = {"whitespace_pattern": whitespace}
        return self.define("json", f"%json {json.dumps(body, ensure_ascii=False)}")


def lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _regex(text: str) -> str:
    """`text` as a literal inside a Lark /regex/ (Rust regex syntax, `/` escaped)."""
    return re.escape(text).replace("/", "\\/").replace("\\\n", "\\n")


def tool_grammar(
    tools: Sequence[Mapping[str, Any]],
    choice: str = "auto",
    name: str = "",
    *,
    parallel: bool = True,
    output_format: str = "plain",
    where: str = "tool_choice",
    markers=None,
    reasoning: bool = True,
) -> Grammar | None:
    """The output a `tool_choice` allows over `tools` (OpenAI style definitions), in the
    markup of `output_format` (module doc). None where nothing is to be held: `auto` for
    a family without a tool grammar, or no tools with `auto`/`none`. `reasoning` False:
    the client switched the reasoning off, so the generation prompt closed it (a
    `-thinking` format is held as its family) and no reasoning block opens before the
    calls. Raises GrammarError.
    """
    if not reasoning:
        output_format = output_format.removesuffix("-thinking")
    if choice not in TOOL_CHOICES:
        raise GrammarError(
            f"{where} must be one of {', '.join(TOOL_CHOICES)} or name a function, got {choice!r}"
        )
    calls = tool_schemas(tools, where)
    if choice == "function":
        if name not in calls:
            known = ", ".join(sorted(calls)) or "none"
            raise GrammarError(f"{where} names tool {name!r}, which is not in tools ({known})")
        calls = {name: calls[name]}
    if choice in ("required", "function") and not calls:
        raise GrammarError(f"{where} {choice!r} needs tools")
    thinking = output_format.endswith("-thinking")
    family = output_format.removesuffix("-thinking")
    markup = table.FAMILIES.get(family)
    if markup is None:
        if choice in ("required", "function"):
            held = ", ".join(table.FAMILIES)
            raise GrammarError(
                f"{where} {choice!r}: the model's output format {output_format!r} has no "
                f"tool-call grammar (its family writes no call markup; families with one: {held})"
            )
        return None
    if choice == "auto" and not calls:
        return None
    g = Lark(SPECIAL_MARKERS if markers is None else markers)
    one = not parallel or choice == "function"
    one = one or markup.shape in ("llama3_json", "harmony", "gigachat")
    if markup.shape == "harmony":
        start = _harmony(g, markup, calls, choice)
    elif markup.shape == "tags":
        start = tag_start(g, markup, calls, choice, one)
    else:
        start = _start(g, markup, calls, choice, one)
    if thinking and markup.shape != "harmony":
        start = f"{g.until(markup.think_close)} body_\nbody_: {start}"
    elif markup.think_open and choice != "auto" and reasoning:  # auto's free text holds it
        name = lit(markup.think_name) if markup.think_name else ""
        block = f"{g.m(markup.think_open)} {name} {g.until(markup.think_close)}"
        start = f"{g.define('reasoning', block)}? body_\nbody_: {start}"
    lark = "\n".join(["%llguidance {}", f"start: {start}", *g.lines, ""])
    kind = f"tools:{choice}" + (":single" if one else "")
    grammar = Grammar(lark, kind, optional=choice == "auto")
    validate(grammar, {"tools": list(tools)}, where)
    return grammar


def reasoning(body: str, output_format: str, markers) -> str | None:
    """The start rule of a schema grammar (`body`) after the format's reasoning: a
    `-thinking` format's free reasoning up to its end, harmony's analysis messages and
    its final channel. None where the output is the body alone."""
    g = Lark(markers)
    markup = table.FAMILIES.get(output_format.removesuffix("-thinking"))
    if markup is not None and markup.shape == "harmony":
        channel, message = g.m("<|channel|>"), g.m("<|message|>")
        start = f'{_analysis(g)}* {channel} "final" {message} {body}'
    elif output_format.endswith("-thinking"):
        close = markup.think_close if markup else table.THINK_CLOSE
        start = f"{g.until(close)} WS {body}"
        g.lines.append("WS: /[\\n ]*/")
    else:
        return None
    return "\n".join([f"start: {start}", *g.lines, ""])


def _analysis(g: Lark) -> str:
    """One harmony analysis message and the next message's start."""
    channel, message, start = (g.m(t) for t in ("<|channel|>", "<|message|>", "<|start|>"))
    body = f'{channel} "analysis" {message} {g.until("<|end|>")} {start} "assistant"'
    return g.define("analysis", body)


def _start(g: Lark, markup, calls, choice: str, one: bool) -> str:
    """The start rule's body: text and calls as `choice` allows."""
    if markup.shape in ("gigachat", "solar"):  # calls as messages of their own
        return tagged.start(g, markup, calls, choice, one)
    opener = markup.opener
    if markup.shape in ("llama3_json", "pythonic") and (choice == "none" or not calls):
        return _plain(g, markup)
    text = g.text(opener)
    if choice == "none" or not calls:
        return text
    single = one or (choice == "auto" and markup.shape == "calls")  # auto repeats the opener
    rest = _after_opener(g, markup, calls, single)  # a block of calls, its opener taken
    if markup.shape in ("llama3_json", "pythonic"):  # calls open the output, or none do
        return _leading(g, markup, rest, choice)
    if choice in ("required", "function"):
        return f"{g.m(opener)} {rest}"
    times = "?" if one or markup.shape != "calls" else "*"
    if g.token(opener):
        return f"{text} ({g.m(opener)} {rest} {text}){times}"
    return f"({g.until(opener)} {rest}){times} {text}"


def _after_opener(g: Lark, markup, calls, one: bool) -> str:
    """Everything after the opener: one call, or (parallel) one or more."""
    shape = markup.shape
    if shape in tagged.SHAPES:
        return tagged.after_opener(g, markup, calls, one)
    if shape == "calls":
        body = g.define("call", " | ".join(_call(g, markup, n, s) for n, s in calls.items()))
        if one:
            return body
        return f"{body} ({_sep(g, markup)} {g.m(markup.opener)} {body})*"
    if shape == "section":
        body = g.define("call", " | ".join(_call(g, markup, n, s) for n, s in calls.items()))
        many = body if one else f"{body} ({_sep(g, markup)} {body})*"
        head = '"\\n"' if markup.args in ("dsml", "minimax") else ""
        return f"{head} {many} {g.m(markup.section_close)}"
    if shape == "array":
        if markup.opener == "Action:":  # Command R+: an indented json code block
            array = g.json(_array_schema(markup, calls, one), INDENTED)
            return f'"\\n```json\\n" {array} "\\n```"'
        array = g.json(_array_schema(markup, calls, one))
        ws = '"\\n"?' if markup.opener == "functools" else ""
        return f"{ws} {array} {g.m(markup.closer) if markup.closer else ''}"
    if shape == "mistral":
        objects = g.json(_array_schema(markup, calls, one, ids=True))
        named = g.define(
            "call",
            " | ".join(f"{lit(n)} {g.m('[ARGS]')} {g.json(closed(s))}" for n, s in calls.items()),
        )
        newer = named if one else f"{named} ({g.m('[TOOL_CALLS]')} {named})*"
        return f"({objects} | {newer})"
    if shape == "llama3_json":
        return g.json({"anyOf": [_call_object(markup, n, s) for n, s in calls.items()]})
    if shape == "pythonic":
        values = Values(g, "python")
        call = g.define(
            "call",
            " | ".join(f'{lit(n)} "(" {values.kwargs(s, ", ", "=")} ")"' for n, s in calls.items()),
        )
        return f'{call} ({lit(", ")} {call})* "]"' if not one else f'{call} "]"'
    raise AssertionError(shape)


def _leading(g: Lark, markup, rest: str, choice: str) -> str:
    """Llama 3 JSON and pythonic calls: the output is the calls (Llama's after its python
    tag or not) or is text that does not start like one."""
    if markup.shape == "pythonic":
        block = f'"[" {rest}'
    else:
        tag = f"{g.m(markup.opener)}?"
        block = f"{tag} {rest}"
    if choice in ("required", "function"):
        return block
    return f"{block} | {_plain(g, markup)}"


def _plain(g: Lark, markup) -> str:
    """Text that does not start like a call of a family whose calls open the output."""
    first = "[" if markup.shape == "pythonic" else "{"
    return g.define("PLAIN", f"/([^{_regex(first)}](.|\\n)*)?/")


def _sep(g: Lark, markup) -> str:
    if markup.args == "glm" or markup.opener.startswith("<｜tool"):
        return '"\\n"?'
    return lit(markup.sep) if markup.sep else ""


def _call(g: Lark, markup, name: str, params: Mapping) -> str:
    """One call of tool `name` in the family's markup (for `calls`: after the opener)."""
    args = markup.args
    n = lit(name)
    if markup.opener == "<tool_call>" and args == "json":  # qwen: name and arguments in JSON
        return f'"\\n" {g.json(_call_object(markup, name, params))} "\\n" {g.m(markup.closer)}'
    if args == "seed":
        return tagged.call(g, markup, name, params)
    values = Values(g, args)
    if args == "qwen_xml":
        head = f'"\\n<function=" {n} ">\\n"'
        return f'{head} {values.params(params)} "</function>\\n" {g.m(markup.closer)}'
    if args == "glm":
        return f'{n} "\\n"? {values.params(params)} {g.m(markup.closer)}'
    if args == "gemma":
        return f'"call:" {n} "{{" {values.kwargs(params, ",", ":")} "}}" {g.m(markup.closer)}'
    if args == "dsml":
        head = f'"<｜DSML｜invoke name=\\"" {n} "\\">\\n"'
        return f'{head} {values.params(params)} "</｜DSML｜invoke>\\n"'
    if args == "minimax":
        return f'"<invoke name=\\"" {n} "\\">" "\\n"? {values.params(params)} "</invoke>\\n"'
    if markup.opener == "<|tool_calls_section_begin|>":  # kimi
        return (
            f'{g.m("<|tool_call_begin|>")} "functions." {n} ":" /[0-9]{{1,3}}/ '
            f"{g.m('<|tool_call_argument_begin|>')} {g.json(closed(params))} "
            f"{g.m('<|tool_call_end|>')}"
        )
    if markup.opener == "<｜tool▁calls▁begin｜>":  # deepseek: V3.1's form, or R1's
        begin, sep, end = (
            g.m(t) for t in ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>")
        )
        args_json = g.json(closed(params))
        return (
            f"{begin} {n} {sep} {args_json} {end} | "
            f'{begin} "function" {sep} {n} "\\n```json\\n" {args_json} "\\n```" {end}'
        )
    raise AssertionError(markup)


def _harmony(g: Lark, markup, calls, choice: str) -> str:
    """gpt-oss: analysis messages (its reasoning), then one call on the commentary
    channel (`to=functions.NAME`, either place harmony puts it) or the final answer."""
    channel, message = g.m("<|channel|>"), g.m("<|message|>")
    analysis = _analysis(g)
    final = f'{channel} "final" {message} {g.define("FREE", ANY)}'
    if choice == "none" or not calls:
        return f"{analysis}* {final}"
    bodies = []
    end = f"{g.m('<|call|>')}?"  # a stop token of gpt-oss: the output may end before it
    for n, s in calls.items():
        args = g.json(closed(s))
        target = f'"to=functions." {lit(n)}'
        constrain = f'(" " {g.m("<|constrain|>")}? "json")?'
        bodies.append(f'{channel} "commentary " {target} {constrain} {message} {args} {end}')
        bodies.append(f'" " {target} {channel} "commentary" {constrain} {message} {args} {end}')
    call = g.define("call", " | ".join(bodies))
    if choice in ("required", "function"):
        return f"{analysis}* {call}"
    return f"{analysis}* ({call} | {final})"


def _call_object(markup, name: str, params: Mapping) -> dict:
    """One call as a JSON object: {name-key: const, arguments-key: its parameters}, strict."""
    key, args = markup.keys
    if markup.keys == table.KEYED:  # {NAME: {arguments}}
        return _keyed_object(name, params)
    return {
        "type": "object",
        "properties": {key: {"const": name}, args: closed(params)},
        "required": [key, args],
        "additionalProperties": False,
    }


def _keyed_object(name: str, params: Mapping) -> dict:
    return {
        "type": "object",
        "properties": {name: closed(params)},
        "required": [name],
        "additionalProperties": False,
    }


def _array_schema(markup, calls, one: bool, ids: bool = False) -> dict:
    """The calls as one JSON array (one item where `one`)."""
    items = []
    for n, s in calls.items():
        item = _call_object(markup, n, s)
        if markup.opener == "<|START_ACTION|>":  # Command R7B numbers its calls
            item["properties"] = {
                "tool_call_id": {"type": "string", "pattern": "^[0-9]{1,3}$"},
                **item["properties"],
            }
            item["required"] = ["tool_call_id", *item["required"]]
        if ids:  # Mistral's v3 calls may carry their id (9 letters and digits)
            item["properties"]["id"] = {"type": "string", "pattern": "^[A-Za-z0-9]{9}$"}
        items.append(item)
    schema = {"type": "array", "items": {"anyOf": items}, "minItems": 1}
    if one:
        schema["maxItems"] = 1
    return schema


def tool_schemas(tools: Sequence[Mapping[str, Any]], where: str) -> dict[str, Mapping]:
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
