"""The wire formats' structured-output fields -> one `Constraint` for the engine's request.

`constraint_for(response_format=..., tool_choice=..., parallel_tool_calls=..., tools=...)`
is the one function every endpoint calls: it reads

- OpenAI chat-completions `response_format` (`{"type": "json_schema", "json_schema":
  {"name", "schema", "strict"}}`, `{"type": "json_object"}`, `{"type": "text"}`);
- OpenAI Responses `text.format` (the same with the schema's fields flat:
  `{"type": "json_schema", "name", "schema", "strict"}`);
- `tool_choice` in OpenAI's shapes (`"auto"`, `"required"`, `"none"`,
  `{"type": "function", "function": {"name"}}`, Responses' `{"type": "function",
  "name"}`) and Anthropic's (`{"type": "auto" | "any" | "tool" | "none", "name",
  "disable_parallel_tool_use"}`), with `parallel_tool_calls`.

The engine builds and checks the grammar (engine.runtime.structured.grammar): a keyword it
cannot enforce, or a tool_choice naming a tool that is not there, comes back
as INVALID_ARGUMENT naming it. Here only the shapes are read: a malformed
one is InvalidInput (the bridge's 400) naming the field. No MLX, no grpc calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from clients.wire import InvalidInput
from engine.proto import engine_pb2


@dataclass(frozen=True)
class Constraint:
    """What a request's output is held to (the proto's Constraint)."""

    json_schema: str = ""  # JSON text of a JSON Schema
    strict: bool = False
    json_object: bool = False
    lark: str = ""  # a grammar in llguidance's Lark syntax
    tool_choice: str = ""  # auto | required | none | function
    tool_name: str = ""
    single_call: bool = False  # parallel_tool_calls false

    def to_proto(self) -> engine_pb2.Constraint:
        c = engine_pb2.Constraint(strict=self.strict)
        if self.json_schema:
            c.json_schema = self.json_schema
        elif self.json_object:
            c.json_object = True
        elif self.lark:
            c.lark = self.lark
        elif self.tool_choice:
            c.tool_choice.CopyFrom(
                engine_pb2.ToolChoice(
                    mode=self.tool_choice, name=self.tool_name, single=self.single_call
                )
            )
        return c


def constraint_for(
    response_format: Any = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
    tools: Any = None,
    where: str = "response_format",
) -> Constraint | None:
    """The request's constraint, or None when its output is free (module doc)."""
    response = _response_format(response_format, where)
    choice = _tool_choice(tool_choice, parallel_tool_calls, tools)
    if response is not None and choice is not None and choice.tool_choice != "none":
        raise InvalidInput(
            f"{where} and tool_choice {choice.tool_choice!r} cannot hold one output together: "
            "send tool_choice 'none' with a structured response, or no response format"
        )
    return response or choice


def _response_format(value: Any, where: str) -> Constraint | None:
    if value is None:
        return None
    value = _plain(value)
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where} must be an object")
    kind = value.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return Constraint(json_object=True)
    if kind != "json_schema":
        raise InvalidInput(f"{where}.type must be text, json_object or json_schema, got {kind!r}")
    spec = value.get("json_schema", value)  # chat-completions nests it; Responses does not
    if not isinstance(spec, Mapping):
        raise InvalidInput(f"{where}.json_schema must be an object")
    schema = spec.get("schema", {})  # none given: any JSON value
    if not isinstance(schema, Mapping):
        raise InvalidInput(f"{where}.json_schema.schema must be an object")
    return Constraint(json_schema=json.dumps(schema), strict=bool(spec.get("strict")))


def _tool_choice(value: Any, parallel: bool | None, tools: Any) -> Constraint | None:
    value = _plain(value)
    single = parallel is False
    if isinstance(value, Mapping):
        kind = value.get("type")
        single = single or bool(value.get("disable_parallel_tool_use"))
        if kind in ("auto", "none", "required"):
            value = kind
        elif kind == "any":  # Anthropic's required
            value = "required"
        elif kind in ("function", "tool"):
            fn = value.get("function", value)
            name = fn.get("name") if isinstance(fn, Mapping) else None
            if not isinstance(name, str) or not name:
                raise InvalidInput("tool_choice names no function")
            return Constraint(tool_choice="function", tool_name=name, single_call=single)
        else:
            raise InvalidInput(f"tool_choice.type {kind!r} is not one of auto, any, tool, none")
    if value is None:
        if not tools:
            return None
        value = "auto"
    if value not in ("auto", "required", "none"):
        raise InvalidInput(f"tool_choice must be auto, required, none or a function, got {value!r}")
    if value == "none" and not tools:
        return None
    return Constraint(tool_choice=value, single_call=single)


def _plain(value: Any) -> Any:
    """A pydantic model (the bridge's bodies) as plain data."""
    dump = getattr(value, "model_dump", None)
    return dump(exclude_none=True) if callable(dump) else value
