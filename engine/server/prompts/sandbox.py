"""A chat template that changes its own lists and dicts, rendered in a sandbox that lets
it: the one thing transformers' sandbox refuses that published templates do.

transformers renders chat templates in jinja2's `ImmutableSandboxedEnvironment`, which
refuses every method that changes a list, dict or set (`list.append`, `dict.update`),
so Kimi K2's published template (`tool_response_queue.ids.append(id)`, `.pop(0)`)
fails on every conversation with a tool call. llama.cpp's own Jinja engine renders it.

`OwnDataSandbox` is that sandbox with only the mutating methods of plain `list` and
`dict` objects allowed again: jinja2's `SandboxedEnvironment` rules still hold for
everything else (no underscore attributes, no unsafe callables, `range` capped), and
sets, strings and every other type stay as before. What a template may change is its
own data: it sees fresh JSON copies of the messages, tools and variables (as
transformers gives it), never the caller's objects. Its environment is transformers'
own (filters, globals, extensions) with this one class changed.

`refuses_mutation(error)` says whether a render failed on exactly this. `render` is
used only then (engine.server.prompts.renders). It knows jinja2 and transformers'
template environment, nothing of the engine.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

# the methods a template may call on a plain list or dict of its own
MUTATORS = {
    list: frozenset({"append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort"}),
    dict: frozenset({"update", "setdefault", "pop", "popitem", "clear"}),
}
_REFUSED = re.compile(r"access to attribute '(\w+)' of '(list|dict)' object is unsafe")


class OwnDataSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, but for the MUTATORS of plain lists and dicts."""

    def is_safe_attribute(self, obj, attr, value) -> bool:
        if attr in MUTATORS.get(type(obj), ()):
            return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)


def refuses_mutation(error: BaseException) -> bool:
    """Whether `error` is the immutable sandbox refusing one of the MUTATORS."""
    if not isinstance(error, SecurityError):
        return False
    m = _REFUSED.search(str(error))
    return m is not None and m.group(1) in MUTATORS[{"list": list, "dict": dict}[m.group(2)]]


@lru_cache(maxsize=16)
def _compiled(template: str):
    """The template in an OwnDataSandbox built like transformers' environment."""
    from transformers.utils import chat_template_utils

    base = chat_template_utils._compile_jinja_template(template).environment
    env = OwnDataSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[type(e) for e in base.extensions.values()],
    )
    env.filters.update(base.filters)
    env.globals.update(base.globals)
    return env.from_string(template)


def render(template: str, messages, tools, **variables) -> str:
    """The template on fresh JSON copies of `messages`, `tools` and `variables`."""
    data = json.loads(json.dumps({"messages": messages, "tools": tools, **variables}))
    return _compiled(template).render(**data)
