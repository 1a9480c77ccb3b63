"""A template that reads `functions` and `datetime` (firefunction-v2's) gets the request's
tools as JSON text and today's date, as llama.cpp gives them; a template that sets them
itself, or a client that sends them, keeps its own."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from engine.server.prompts import variables
from engine.server.prompts.renders import TemplateRenders
from tests.tokenizers import tokenizer_dir

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
ASK = [{"role": "user", "content": "go"}]


def _renders(tmp_path, template: str) -> TemplateRenders:
    from mlx_lm.utils import load_tokenizer

    return TemplateRenders(load_tokenizer(tokenizer_dir(tmp_path, template)))


def test_functions_and_datetime_come_from_the_request(tmp_path):
    renders = _renders(tmp_path, "{{ functions }}|Today is {{ datetime }}.")
    text = renders.render(ASK, TOOLS, False)
    functions, today = text.split("|")
    assert json.loads(functions) == TOOLS and functions == json.dumps(TOOLS, indent=2)
    assert today == f"Today is {datetime.now(timezone.utc):%b %d %Y}."
    assert renders.render(ASK, None, False).startswith("|Today is ")


def test_a_template_or_a_client_that_sets_them_keeps_its_own(tmp_path):
    assert variables.missing("{% set functions = 'mine' %}{{ functions }}", TOOLS) == {}
    assert variables.missing("{{ tools }}", TOOLS) == {}
    renders = _renders(tmp_path, "{{ datetime }}")
    assert renders.render(ASK, None, False, template_kwargs={"datetime": "then"}) == "then"
