"""A Responses request's `tools` as the function tools the engine offers the model.

Function tools pass as they are. The function tools inside a `namespace` tool
(`{"type": "namespace", "name": NS, "tools": [...]}`, as Codex CLI groups its
sub-agent tools) are offered under `NS__NAME`, a name a function may have, and
a call the model makes to one comes back as Responses writes a namespaced call:
`name` NAME and `namespace` NS (`Offered.call_name`); a `function_call` input
item with a `namespace` is rendered under the offered name again
(`offered_name`), so the model reads its own call back. Hosted tools, which
OpenAI runs itself (web search, file search, code interpreter, computer use,
...), cannot run here: they are left out of the prompt and named in
`Offered.left_out` (the endpoint names them in a header and its log), unless
`tool_choice` forces one, which is an `InvalidInput` naming it. It knows the
Responses tool shapes; nothing of HTTP or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clients.wire import InvalidInput

SEPARATOR = "__"  # NS__NAME: the offered name of NAME inside namespace NS


def offered_name(name: str, namespace: str | None) -> str:
    """The name the model sees for `name` inside `namespace` (None: no namespace)."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


@dataclass(frozen=True)
class Offered:
    """The engine's function tools, what each namespaced one stands for, and the hosted
    tool types left out."""

    functions: tuple[dict, ...] = ()
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # offered: (ns, name)
    left_out: tuple[str, ...] = ()

    def call_name(self, offered: str) -> tuple[str, str | None]:
        """A call's (name, namespace) as Responses writes it; namespace None: none."""
        if offered in self.namespaced:
            namespace, name = self.namespaced[offered]
            return name, namespace
        return offered, None


def _function(tool: dict, where: str, namespace: str | None = None) -> dict:
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise InvalidInput(f"{where}.name: a function tool needs a name")
    # OpenAI's key order: the template renders each tool as JSON, as it comes
    function = {"name": offered_name(tool["name"], namespace)}
    if tool.get("description"):
        function["description"] = str(tool["description"])
    function["parameters"] = tool.get("parameters") or {"type": "object"}
    return {"type": "function", "function": function}


def tools_of(tools: Any) -> Offered:
    """Responses `tools` -> Offered: functions and namespaced functions offered, any other
    tool type left out (a tool OpenAI runs itself)."""
    if tools is None:
        return Offered()
    if not isinstance(tools, list):
        raise InvalidInput("tools: must be a list")
    functions, namespaced, left_out = [], {}, []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidInput(f"{where}: must be an object")
        kind = tool.get("type")
        if kind == "function":
            functions.append(_function(tool, where))
        elif kind == "namespace":
            ns = tool.get("name")
            if not isinstance(ns, str) or not ns:
                raise InvalidInput(f"{where}.name: a namespace needs a name")
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise InvalidInput(f"{where}.tools: must be a list")
            for j, sub in enumerate(inner):
                at = f"{where}.tools[{j}]"
                if not isinstance(sub, dict) or sub.get("type", "function") != "function":
                    left_out.append(f"{ns}.{sub.get('type') if isinstance(sub, dict) else sub}")
                    continue
                functions.append(_function(sub, at, ns))
                namespaced[functions[-1]["function"]["name"]] = (ns, sub["name"])
        else:
            left_out.append(str(kind))
    return Offered(tuple(functions), namespaced, tuple(left_out))


def check_choice(choice: Any, offered: Offered) -> Any:
    """`tool_choice` with a namespaced function named as the model sees it; a choice that
    forces a tool left out is an InvalidInput naming it."""
    if not isinstance(choice, dict):
        return choice
    kind = choice.get("type")
    if kind in ("function", "allowed_tools", "auto"):
        if kind == "function" and choice.get("namespace"):
            name = offered_name(str(choice.get("name")), str(choice["namespace"]))
            return dict(choice, name=name)
        return choice
    if kind is not None:  # a hosted tool's type: web_search, file_search, ...
        raise InvalidInput(
            f"tool_choice: it forces {kind!r}, a tool this engine cannot run "
            "(it is left out of the prompt)"
        )
    return choice
