"""The body of a tool call -> a Call, for the families whose body is one call: qwen's
JSON, glm's `<arg_key>` pairs, qwen_xml's `<function=…>`, deepseek's `<｜tool▁sep｜>`,
dsml's `<｜DSML｜parameter …>`, kimi's `functions.NAME:I`. Each answers None when the
body is not its family's markup. clients.bridge.parsers wires them to the markers;
clients.bridge.call_bodies reads the families whose body holds a list of calls.
Plain Python, no MLX.
"""

import json
import re
import uuid
from dataclasses import dataclass

from clients.bridge.call_bodies import string_arguments as _string_arguments
from clients.bridge.literals import json_at, json_value


@dataclass(frozen=True)
class Call:
    """One parsed tool call: its name, arguments, their JSON text, and its id."""

    name: str
    arguments: dict
    arguments_text: str
    call_id: str


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# `{"name": "...", "arguments": ` as the templates render it: the arguments' own text follows.
_QWEN_HEAD = re.compile(
    r'\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)


def parse_qwen_call(body: str, tools=None) -> Call | None:
    """`{"name": ..., "arguments": {...}}` (arguments may be a JSON string of an object)."""
    text = body.strip()
    obj = json_value(text)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    args_text = None
    if isinstance(args, str):
        args_text = args
        args = json_value(args)
    elif (head := _QWEN_HEAD.match(text)) is not None:
        # the model's own text of the arguments, when they come right after the name
        found = json_at(text, head.end())
        if found is not None and found[0] == args and text[found[1] :].strip() == "}":
            args_text = text[head.end() : found[1]]
    if not isinstance(args, dict):
        return None
    if args_text is None:
        args_text = json.dumps(args, ensure_ascii=False)
    return Call(obj["name"], args, args_text, new_call_id())


GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def parse_glm_call(body: str, tools=None) -> Call | None:
    """`NAME<arg_key>K</arg_key><arg_value>V</arg_value>...`: a value is JSON unless the tool
    declares it a string or it does not decode."""
    name, _, rest = body.partition("<arg_key>")
    name = name.strip()
    if not name or any(c in name for c in "<>\n{"):
        return None
    rest = "<arg_key>" + rest if rest else ""
    strings = _string_arguments(name, tools)
    args = {}
    for m in GLM_PAIR.finditer(rest):
        key, value = m.group(1).strip(), m.group(2).strip()
        args[key] = value if key in strings else json_value(value, value)
    if GLM_PAIR.sub("", rest).strip():  # something besides the pairs: not this format
        return None
    return Call(name, args, json.dumps(args, ensure_ascii=False), new_call_id())


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def parse_xml_call(body: str, tools=None) -> Call | None:
    """`<function=NAME><parameter=K>V</parameter>...</function>`: a value is JSON unless
    the tool declares it a string or it does not decode."""
    m = _XML_FUNCTION.fullmatch(body)
    if m is None:
        return None
    name, rest = m.group(1).strip(), m.group(2)
    strings = _string_arguments(name, tools)
    args = {}
    for p in XML_PARAMETER.finditer(rest):
        key, value = p.group(1).strip(), p.group(2)
        args[key] = value if key in strings else json_value(value, value)
    if not name or XML_PARAMETER.sub("", rest).strip():  # something besides parameters
        return None
    return Call(name, args, json.dumps(args, ensure_ascii=False), new_call_id())


_DEEPSEEK_SEP = "<｜tool▁sep｜>"


def parse_deepseek_call(body: str, tools=None) -> Call | None:
    """`NAME<｜tool▁sep｜>{...}` (V3.1; the JSON may be fenced in ```json ... ```), or
    `function<｜tool▁sep｜>NAME` then the JSON in a ```json fence (V3, the R1 distills)."""
    name, marker, args_text = body.partition(_DEEPSEEK_SEP)
    name = name.strip()
    if name == "function" and not args_text.lstrip().startswith(("{", "`")):
        name, _, args_text = args_text.partition("\n")
        name = name.strip()
    args_text = args_text.strip().removeprefix("```json").removesuffix("```").strip()
    if not marker or not name or any(c in name for c in "<>\n{"):
        return None
    args = json_value(args_text) if args_text else {}
    if not isinstance(args, dict):
        return None
    return Call(name, args, args_text or "{}", new_call_id())


DSML = "｜DSML｜"
DSML_PARAMETER = re.compile(
    r'<｜DSML｜parameter name="([^"]+)"(?: string="(true|false)")?>(.*?)</｜DSML｜parameter>',
    re.DOTALL,
)


def parse_dsml_call(body: str, tools=None) -> Call | None:
    """`NAME">` then `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`
    (the opener `<｜DSML｜invoke name="` is the call's marker)."""
    name, marker, rest = body.partition('">')
    name = name.strip()
    if not marker or not name or any(c in name for c in '<>"\n'):
        return None
    args = {}
    for m in DSML_PARAMETER.finditer(rest):
        key, is_string, value = m.group(1), m.group(2), m.group(3)
        args[key] = value if is_string == "true" else json_value(value, value)
    if DSML_PARAMETER.sub("", rest).strip():  # something besides parameters
        return None
    return Call(name, args, json.dumps(args, ensure_ascii=False), new_call_id())


_KIMI_ARGS = "<|tool_call_argument_begin|>"
_KIMI_ID = re.compile(r"(?:functions\.)?([^\s:]+):\d+")


def parse_kimi_call(body: str, tools=None) -> Call | None:
    """`functions.NAME:I<|tool_call_argument_begin|>{...}`; the id stays `functions.NAME:I`
    (the template renders it back)."""
    head, marker, args_text = body.partition(_KIMI_ARGS)
    call_id, args_text = head.strip(), args_text.strip()
    m = _KIMI_ID.fullmatch(call_id)
    if not marker or m is None:
        return None
    args = json_value(args_text)
    if not isinstance(args, dict):
        return None
    return Call(m.group(1), args, args_text, call_id)
