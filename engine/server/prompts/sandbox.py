"""A chat template that changes its own lists and dicts, or hands `tojson` what Jinja's
own filters make, rendered as llama.cpp renders it: the two things transformers'
render refuses that published templates do.

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

Its `tojson` takes a generator (llama.cpp's DeepSeek-R1 template writes
`tools | map(attribute='function') | tojson`, which transformers' `json.dumps` refuses)
as the list it yields, as Jinja's other filters and llama.cpp's engine treat it.

`needs_own_render(error)` says whether transformers' render failed on exactly one of
these. `render` is used only then (engine.server.prompts.renders). It knows jinja2 and transformers'
template environment, nothing of the engine.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from types import GeneratorType

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


def needs_own_render(error: BaseException) -> bool:
    """Whether transformers' render failed on what this module's renders: a change to
    the template's own list or dict, or a sequence that Jinja's own filters made
    (`tools | map(attribute='function')`, a generator) given to `tojson`."""
    generator = isinstance(error, TypeError) and "type generator is not JSON" in str(error)
    return generator or refuses_mutation(error)


def _listed(value):
    """`value` with the generators Jinja's filters make turned into lists (as JSON has)."""
    if isinstance(value, GeneratorType):
        return [_listed(v) for v in value]
    if isinstance(value, list):
        return [_listed(v) for v in value]
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    return value


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
    tojson = base.filters["tojson"]
    env.filters["tojson"] = lambda value, *a, **kw: tojson(_listed(value), *a, **kw)
    return env.from_string(template)


def render(template: str, messages, tools, **variables) -> str:
    """The template on fresh JSON copies of `messages`, `tools` and `variables`."""
    data = json.loads(json.dumps({"messages": messages, "tools": tools, **variables}))
    return _compiled(template).render(**data)
