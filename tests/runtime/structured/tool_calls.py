"""Reading a tool call back from each family's markup, for the grammar tests.

A small reader per family, written after the family's published chat template (how
it renders a past call), independent of the bridge's parsers: `calls(family, text,
schemas)` is the list of (name, arguments) the text holds, and raises where the
markup is not well-formed. String parameters of the XML-ish families are their text;
other values are JSON (Python literals for pythonic calls).
"""

from __future__ import annotations

import ast
import json
import re

S = re.S


def _value(raw: str, schema) -> object:
    if isinstance(schema, dict) and (schema.get("type") == "string" or "enum" in schema):
        return raw
    return json.loads(raw)


def _params(pairs, props) -> dict:
    return {k: _value(v, props.get(k, {})) for k, v in pairs}


def _gemma(text: str) -> dict:
    """Gemma's `k:<|"|>v<|"|>,n:3` as a dict: strings between the quote tokens, bare keys."""
    parts = re.split(r'(<\|"\|>.*?<\|"\|>)', text, flags=S)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(json.dumps(part[5:-5]))
        else:
            out.append(re.sub(r"(^|[{,])\s*([A-Za-z_][\w.-]*):", r'\1"\2":', part))
    return json.loads("{" + "".join(out) + "}")


def _pythonic(text: str) -> list:
    tree = ast.parse(text.strip(), mode="eval").body
    assert isinstance(tree, ast.List), text
    return [(c.func.id, {k.arg: ast.literal_eval(k.value) for k in c.keywords}) for c in tree.elts]


def calls(family: str, text: str, schemas: dict) -> list[tuple[str, dict]]:
    """The calls in `text` (module doc). `schemas`: tool name -> parameters schema."""

    def props(name):
        return schemas[name].get("properties", {})

    def found(pattern, where=text):
        hits = re.findall(pattern, where, S)
        assert hits, f"no {family} call in {text!r}"
        return hits

    if family == "qwen":
        return [
            (c["name"], c["arguments"])
            for c in map(json.loads, found(r"<tool_call>\n(.*?)\n</tool_call>"))
        ]
    if family == "qwen_xml":
        out = []
        for name, body in found(
            r"<tool_call>\n<function=([\w.-]+)>\n(.*?)</function>\n</tool_call>"
        ):
            pairs = re.findall(r"<parameter=([\w.-]+)>\n(.*?)\n</parameter>\n", body, S)
            out.append((name, _params(pairs, props(name))))
        return out
    if family == "glm":
        out = []
        for name, body in found(r"<tool_call>([\w.-]+)\n?(.*?)</tool_call>"):
            pairs = re.findall(r"<arg_key>(.*?)</arg_key>\n?<arg_value>(.*?)</arg_value>", body, S)
            out.append((name, _params(pairs, props(name))))
        return out
    if family == "kimi":
        section = found(r"<\|tool_calls_section_begin\|>(.*?)<\|tool_calls_section_end\|>")[0]
        pattern = (
            r"<\|tool_call_begin\|>functions\.([\w.-]+):\d+"
            r"<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>"
        )
        return [(n, json.loads(a)) for n, a in found(pattern, section)]
    if family == "deepseek":
        section = found(r"<｜tool▁calls▁begin｜>(.*?)<｜tool▁calls▁end｜>")[0]
        pattern = (
            r"<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>([\w.-]+)\n```json\n(.*?)\n```"
            r"|([\w.-]+)<｜tool▁sep｜>(.*?))<｜tool▁call▁end｜>"
        )
        return [(a or c, json.loads(b or d)) for a, b, c, d in found(pattern, section)]
    if family == "dsml":
        section = found(r"<｜DSML｜function_calls>\n(.*?)</｜DSML｜function_calls>")[0]
        out = []
        for name, body in found(
            r'<｜DSML｜invoke name="([\w.-]+)">\n(.*?)</｜DSML｜invoke>\n', section
        ):
            pattern = (
                r'<｜DSML｜parameter name="([\w.-]+)" string="(true|false)">'
                r"(.*?)</｜DSML｜parameter>\n"
            )
            out.append(
                (
                    name,
                    {
                        k: v if s == "true" else json.loads(v)
                        for k, s, v in re.findall(pattern, body, S)
                    },
                )
            )
        return out
    if family == "minimax":
        section = found(r"<minimax:tool_call>\n(.*?)</minimax:tool_call>")[0]
        out = []
        for name, body in found(r'<invoke name="([\w.-]+)">\n?(.*?)</invoke>\n', section):
            pairs = re.findall(r'<parameter name="([\w.-]+)">(.*?)</parameter>\n?', body, S)
            out.append((name, _params(pairs, props(name))))
        return out
    if family == "llama3_json":
        call = json.loads(text.removeprefix("<|python_tag|>"))
        return [(call["name"], call["parameters"])]
    if family == "pythonic":
        return _pythonic(text)
    if family == "mistral":
        body = found(r"\[TOOL_CALLS\](.*)$")[0]
        if body.startswith("["):
            return [(c["name"], c["arguments"]) for c in json.loads(body)]
        return [
            (n, json.loads(a))
            for n, a in (c.split("[ARGS]", 1) for c in body.split("[TOOL_CALLS]"))
        ]
    if family == "harmony":
        pattern = (
            r"to=functions\.([\w.-]+)(?:<\|channel\|>commentary)? ?(?:<\|constrain\|>)?"
            r"(?:json)?<\|message\|>(.*?)(?:<\|call\|>|$)"
        )
        return [(n, json.loads(a)) for n, a in found(pattern)]
    if family == "gemma4":
        return [
            (n, _gemma(a)) for n, a in found(r"<\|tool_call>call:([\w.-]+)\{(.*?)\}<tool_call\|>")
        ]
    if family == "apertus":
        items = json.loads(found(r"<\|tools_prefix\|>(.*)<\|tools_suffix\|>")[0])
        return [(n, a) for item in items for n, a in item.items()]
    if family == "seed_oss":
        out = []
        pattern = r"<seed:tool_call>\n<function=([\w.-]+)>\n(.*?)</function>\n</seed:tool_call>"
        for name, body in found(pattern):
            pairs = re.findall(r"<parameter=([\w.-]+)>(.*?)</parameter>\n", body, S)
            out.append((name, _params(pairs, props(name))))
        return out
    if family.startswith("gigachat3"):
        call = json.loads(found(r"(?:call<\|role_sep\|>\n|<\|function_call\|>)\s*(\{.*\})")[0])
        return [(call["name"], call["arguments"])]
    if family == "lfm2":
        return _pythonic(found(r"<\|tool_call_start\|>(.*)<\|tool_call_end\|>")[0])
    if family == "solar_open":
        pattern = (
            r"<\|tool_call:begin\|>[a-z0-9]{10}<\|tool_call:name\|>([\w.-]+)"
            r"<\|tool_call:args\|>(.*?)<\|tool_call:end\|>"
        )
        return [(n, json.loads(a)) for n, a in found(pattern)]
    array = {
        "apriel": r"<tool_calls>(.*)</tool_calls>",
        "command_r": r"^Action:\n```json\n(.*)\n```$",
        "command_r7b": r"<\|START_ACTION\|>(.*)<\|END_ACTION\|>",
        "nemotron": r"<TOOLCALL>(.*)</TOOLCALL>",
        "granite": r"^<\|tool_call\|>(.*)$",
        "phi4": r"^functools\n?(.*)$",
    }[family]
    keys = ("tool_name", "parameters") if family.startswith("command_r") else ("name", "arguments")
    return [(c[keys[0]], c[keys[1]]) for c in json.loads(found(array)[0])]
