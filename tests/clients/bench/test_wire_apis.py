"""`lineage bench agents --api`: the traffic's messages in each wire's shape (plain Python),
and a small served run whose three wire formats cache the same share of the oracle."""

from __future__ import annotations

import pytest

from clients.bench import agents
from clients.bench.agents import wire_apis
from clients.bench.agents.traffic import build_traffic

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Run f."},
    {"role": "assistant", "content": "Running.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    {"role": "user", "content": "Thanks."},
]
SPEC = type("Spec", (), {"max_tokens": 4})()


def test_anthropic_turns_alternate_with_tool_results_in_the_user_turn():
    body = wire_apis.messages_body(CONVERSATION, [], SPEC)
    assert body["system"] == "Be brief."
    assert [t["role"] for t in body["messages"]] == ["user", "assistant", "user"]
    assert [b["type"] for b in body["messages"][1]["content"]] == ["text", "tool_use"]
    assert body["messages"][1]["content"][1]["input"] == {"a": 1}
    assert [b["type"] for b in body["messages"][2]["content"]] == ["tool_result", "text"]


def test_a_chain_sends_only_what_follows_the_stored_reply():
    chains = wire_apis.Chains()
    first = chains.body("s", CONVERSATION[:2], [], 4)
    assert "previous_response_id" not in first and len(first["input"]) == 1
    chains.record("s", CONVERSATION[:2], "Running.", "resp_1")
    follow = chains.body("s", CONVERSATION, [], 4)
    assert follow["previous_response_id"] == "resp_1"
    kinds = [i.get("type", "message") for i in follow["input"]]
    assert kinds == ["function_call", "function_call_output", "message"]
    edited = CONVERSATION[:2] + [{"role": "assistant", "content": "Other."}]
    assert "previous_response_id" not in chains.body("s", edited, [], 4)


def test_the_api_flag_is_read():
    import argparse

    parser = argparse.ArgumentParser()
    agents.add_arguments(parser)
    opts = agents.options_from_args(parser.parse_args(["--api", "chat, responses"]))
    assert opts.apis == ("chat", "responses")


@pytest.mark.parametrize("api", wire_apis.APIS)
def test_each_wire_format_renders_the_prompt_the_benchmark_renders(engine, api, tmp_path):
    """The served run checks every request's prompt token for token; a small one here."""
    import httpx

    from clients.bridge.app import BridgeOptions
    from clients.bridge.models import ServedModels
    from tests.clients.bridge.test_bridge import BridgeThread

    traffic = build_traffic(0, 0.05, 2, 0)
    ids = agents.PromptIds(engine.engine.info.path)

    bridge = BridgeThread(engine.address, options=BridgeOptions(ServedModels((), ("*",))))
    try:
        spec = traffic.requests[0]
        messages = [{"role": "system", "content": traffic.systems[spec.system]}, *spec.new_messages]
        if api == "responses":
            body = wire_apis.Chains().body("s", messages, traffic.tools, 2)
        else:
            body = (wire_apis.chat_body if api == "chat" else wire_apis.messages_body)(
                messages, traffic.tools, type("S", (), {"max_tokens": 2})()
            )
        with httpx.stream("POST", bridge.url + wire_apis.PATHS[api], json=body, timeout=120) as r:
            got = wire_apis.read_stream(api, r)
        assert got["completed"] and got["prompt"] == len(ids.encode(messages, traffic.tools))
    finally:
        bridge.stop()
