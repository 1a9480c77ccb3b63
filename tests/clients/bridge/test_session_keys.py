"""One conversation, one session hint, three wire formats: the engine's request log names
the same session key and namespace for each (chat completions, Anthropic Messages,
Responses), for every hint an agent sends: `prompt_cache_key`, the `x-session-id`,
`session_id` and `x-session-affinity` headers, Claude Code's `metadata.user_id`, `user`.
Real bridge, real gRPC server, Ray and MLX."""

from __future__ import annotations

import logging
import uuid

import httpx
import pytest

from clients.bridge.app import BridgeOptions
from clients.bridge.models import ServedModels
from clients.wire import session_key
from tests.clients.bridge.test_bridge import BridgeThread

SYSTEM = "You are a terse assistant."
QUESTION = "Say something about prompt caches."


@pytest.fixture(scope="module")
def bridge(engine, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store") / "responses")
    b = BridgeThread(engine.address, options=BridgeOptions(ServedModels(), store))
    yield b
    b.stop()


def _bodies(fields: dict) -> dict[str, dict]:
    """The same conversation as each wire's body, with `fields` (the hint) added."""
    return {
        "/v1/chat/completions": {
            "model": "lineage",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": QUESTION},
            ],
            "max_tokens": 1,
            "temperature": 0,
        }
        | fields,
        "/v1/messages": {
            "model": "lineage",
            "system": SYSTEM,
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 1,
            "temperature": 0,
        }
        | fields,
        "/v1/responses": {
            "model": "lineage",
            "instructions": SYSTEM,
            "input": QUESTION,
            "max_output_tokens": 1,
            "temperature": 0,
            "store": False,
        }
        | fields,
    }


def _logged(caplog, start: int) -> list[str]:
    return [r.getMessage() for r in caplog.records[start:] if r.name == "lineage.request"]


def _field(line: str, name: str) -> str:
    return line.split(f" {name}=")[1].split(" ")[0]


CLAUDE_CODE_USER = "user_4f2a_account_9c1e_session_1b7e2c44-5d0a-4e8e-9f3c-2a1d6b0c9e11"
HINTS = {
    "prompt_cache_key": ({"prompt_cache_key": "agent-{}"}, {}),
    "x-session-id": ({}, {"x-session-id": "agent-{}"}),
    "session_id": ({}, {"session_id": "agent-{}"}),
    "x-session-affinity": ({}, {"x-session-affinity": "agent-{}"}),
    "metadata.user_id": ({"metadata": {"user_id": CLAUDE_CODE_USER + "-{}"}}, {}),
    "user": ({"user": "someone+{}@example.com"}, {}),
}


@pytest.mark.parametrize("hint", list(HINTS))
def test_every_wire_reads_the_same_session_key_and_namespace(bridge, caplog, hint):
    fields, headers = HINTS[hint]
    tag = uuid.uuid4().hex[:8]
    fields = {k: _filled(v, tag) for k, v in fields.items()}
    headers = {k: v.format(tag) for k, v in headers.items()}
    value = next(iter((fields | headers).values()))
    value = value["user_id"] if isinstance(value, dict) else value
    namespace = f"sessions-{tag}"
    headers = headers | {"x-cache-namespace": namespace}
    seen = {}
    with caplog.at_level(logging.INFO, "lineage.request"), httpx.Client(timeout=120) as http:
        for path, body in _bodies(fields).items():
            start = len(caplog.records)
            reply = http.post(bridge.url + path, json=body, headers=headers)
            assert reply.status_code == 200, (path, reply.text)
            (line,) = _logged(caplog, start)
            seen[path] = (_field(line, "session"), _field(line, "namespace"))
    assert set(seen.values()) == {(session_key(value), namespace)}, seen


def _filled(value, tag: str):
    if isinstance(value, dict):
        return {k: _filled(v, tag) for k, v in value.items()}
    return value.format(tag)


def test_a_hint_keeps_its_place_in_the_order(bridge, caplog):
    """prompt_cache_key before the headers, the headers before metadata.user_id and user,
    on every wire."""
    tag = uuid.uuid4().hex[:8]
    fields = {"metadata": {"user_id": f"cc-{tag}"}, "user": f"u-{tag}"}
    headers = {"session_id": f"second-{tag}", "x-session-affinity": f"third-{tag}"}
    with caplog.at_level(logging.INFO, "lineage.request"), httpx.Client(timeout=120) as http:
        for path, body in _bodies(fields).items():
            start = len(caplog.records)
            assert http.post(bridge.url + path, json=body, headers=headers).status_code == 200
            (line,) = _logged(caplog, start)
            assert _field(line, "session") == f"second-{tag}", path
            assert _field(line, "namespace") == "-", path  # `user` names no namespace
