"""Variables a published chat template reads that an OpenAI-style request does not
define, given the values llama.cpp gives them.

- `functions` (Fireworks' firefunction-v2): the request's tools as JSON text, indented
  by 2 (`""` without tools), as llama.cpp's firefunction-v2 handler passes it;
- `datetime` (firefunction-v2): today's date, `Dec 06 2026`. llama.cpp writes the time
  to the second; a value that changes every second would make every request's system
  prompt new, so nothing of it could come from the cache: the day is enough for
  "Today is …".

`missing(template, tools)` answers the ones the template reads and does not set
itself (jinja2's own analysis of the template's source; nothing runs); the client's
own template variables override them (engine.server.prompts.renders). It knows jinja2
and nothing of the engine.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from functools import lru_cache

import jinja2
from jinja2 import meta

KNOWN = ("functions", "datetime")


@lru_cache(maxsize=32)
def _reads(template: str) -> frozenset[str]:
    """The KNOWN variables `template` reads and does not set (none where it does not
    parse: the render reports that)."""
    try:
        names = meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError:
        return frozenset()
    return frozenset(n for n in KNOWN if n in names)


def missing(template, tools) -> dict:
    """The KNOWN variables the template reads, with their values for this request."""
    if not isinstance(template, str):
        return {}
    out = {}
    for name in _reads(template):
        if name == "functions":
            out[name] = json.dumps(list(tools), indent=2, ensure_ascii=False) if tools else ""
        elif name == "datetime":
            out[name] = datetime.now(timezone.utc).strftime("%b %d %Y")
    return out
