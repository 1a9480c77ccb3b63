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

from clients.bridge.anthropic_request import prompt_of
from clients.bridge.responses_input import messages_of
from clients.bridge.responses_tools import tools_of
from engine.server.prompts.prompt import PromptBuilder, PromptInput

HERE = Path(__file__).resolve().parent
ASSETS = HERE.parents[1] / "engine" / "runtime" / "model" / "assets" / "tokenizer"
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
            marks=prompt.marks,
        )
    if path == "/v1/responses":
        system = (
            [{"role": "system", "content": body["instructions"]}]
            if body.get("instructions")
            else []
        )
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


def test_codexs_namespace_is_offered_under_names_that_map_back_and_web_search_left_out():
    body = captured("codex")[0]["body"]
    kinds = [t["type"] for t in body["tools"]]
    assert "namespace" in kinds and "web_search" in kinds, kinds
    offered = tools_of(body["tools"])
    names = [t["function"]["name"] for t in offered.functions]
    assert offered.left_out == ("web_search",)
    spaced = [n for n in names if "__" in n]
    assert "multi_agent_v1__spawn_agent" in spaced
    assert all(offered.call_name(n) == tuple(reversed(n.split("__"))) for n in spaced)
    assert offered.call_name("exec_command") == ("exec_command", None)
    # Codex sends a namespaced call back with its namespace: the model reads its own name
    call = {"type": "function_call", "call_id": "c", "name": "spawn_agent"}
    call |= {"namespace": "multi_agent_v1", "arguments": "{}"}
    (turn,) = messages_of([call], set())
    assert turn["tool_calls"][0]["function"]["name"] == "multi_agent_v1__spawn_agent"


def test_claude_codes_breakpoints_are_marks_that_join_the_anchor_and_the_prompt_end(builder):
    """Claude Code marks its system prompt and its last message with cache_control: they
    become marks (capture points), which fall on the anchor and on the prompt's end, the
    points the engine takes anyway: on its traffic they join the engine's own."""
    for entry in captured("claude-code"):
        inp = engine_input(entry["path"], entry["body"])
        assert inp.marks == (0, len(inp.messages) - 1)
        built = builder.build(inp)
        size = len(built.tokens)
        ends = built.layout.marked(size)
        assert ends[-1] == size  # the prompt end: stored with the reply
        assert 0 <= ends[0] - built.anchor_len <= builder.anchor_slack + 1  # the anchor
