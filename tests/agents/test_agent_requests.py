"""The coding agents' own requests, as captured from the real CLIs (tests/agents/requests:
Claude Code's Messages, Codex CLI's Responses, OpenCode's chat completions), through the
bridge's request parsing and the embedded model's chat template, without the CLIs: each
renders, its system block and tools are the anchor, and the shapes only these agents send
(a `system`-role message inside Claude Code's messages, Codex's namespace of tools and its
hosted web search) land where they should. No Ray, no server."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from clients.openai.anthropic_request import prompt_of
from clients.openai.responses_input import messages_of
from clients.openai.responses_tools import tools_of
from engine.server.prompt import PromptBuilder, PromptInput

HERE = Path(__file__).resolve().parent
ASSETS = HERE.parents[1] / "engine" / "runtime" / "assets" / "tokenizer"
CAPTURED = sorted((HERE / "requests").glob("*.json"))


def captured(prefix: str) -> list[dict]:
    """The request bodies captured from one agent (the file whose name starts `prefix`)."""
    (path,) = [p for p in CAPTURED if p.name.startswith(prefix)]
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def builder():
    from mlx_lm.utils import load_tokenizer

    return PromptBuilder(load_tokenizer(ASSETS), 1 << 20, 1 << 20)


def engine_input(path: str, body: dict) -> PromptInput:
    """What the bridge sends the engine for one captured request (its prompt's part)."""
    if path == "/v1/messages":
        fields = ("messages", "system", "tools", "tool_choice")
        prompt = prompt_of(SimpleNamespace(**{k: body.get(k) for k in fields}))
        return PromptInput(
            messages=prompt.messages,
            tools=prompt.tools or None,
            add_generation_prompt=not prompt.continue_final,
            continue_final_message=prompt.continue_final,
        )
    if path == "/v1/responses":
        system = [{"role": "system", "content": body["instructions"]}]
        tools = tools_of(body.get("tools")).functions
        return PromptInput(tuple(system + messages_of(body["input"], set())), tools or None)
    assert path == "/v1/chat/completions", path
    messages = [
        dict(m, role="system" if m["role"] == "developer" else m["role"]) for m in body["messages"]
    ]
    return PromptInput(tuple(messages), tuple(body.get("tools") or ()) or None)


@pytest.mark.parametrize("path", CAPTURED, ids=[p.stem for p in CAPTURED])
def test_every_captured_request_renders_with_its_system_and_tools_as_the_anchor(builder, path):
    for entry in json.loads(path.read_text()):
        inp = engine_input(entry["path"], entry["body"])
        prompt = builder.build(inp)
        messages, _ = builder.volatile.apply(inp.messages)  # the billing line goes first
        first_user = next(i for i, m in enumerate(messages) if m["role"] != "system")
        head = list(messages[:first_user])
        head_ids = builder.tokenizer.encode(builder.render(head, inp.tools, False))
        assert len(prompt.tokens) > 1000  # an agent's system prompt and tools
        assert prompt.anchor_len >= len(head_ids) - builder.anchor_slack - 8


def test_claude_codes_system_message_is_its_own_system_turn_after_the_first_user_message(
    builder,
):
    """Claude Code (its default model) sends its environment block as a `system` message
    after a user message of reminders: rendered there, it leaves the anchor alone."""
    first, later = captured("claude-code")
    roles = [m["role"] for m in first["body"]["messages"]]
    assert roles == ["user", "system"], roles
    inp = engine_input(first["path"], first["body"])
    assert [m["role"] for m in inp.messages] == ["system", "user", "system"]
    text = builder.render(list(inp.messages), inp.tools, True)
    env = inp.messages[2]["content"]
    assert env.startswith("# Environment")
    assert text.index("<|im_start|>user\n") < text.index("<|im_start|>system\n" + env)
    # the next turn keeps the same anchor: its system block and tools are the same
    a, b = builder.build(inp), builder.build(engine_input(later["path"], later["body"]))
    assert a.anchor_len == b.anchor_len > 0
    assert a.tokens[: a.anchor_len] == b.tokens[: b.anchor_len]
