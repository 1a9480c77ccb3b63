"""The cache page (`/ui`) in a real headless Chromium, under agent traffic through the bridge.

Two sub-agents share one system prompt and tool list (an anchor) and each runs two
turns under its own session key; then a third one comes with a changed system
prompt. The page, polling `/ui/tree` through the bridge's gRPC client and the
engine's CacheTree RPC, must show: the anchor with both conversations under it,
a conversation's restore point at the prompt end of its latest turn (the `reply`
checkpoint, at the prompt tokens the bridge reported), the miss in words, the
memory shares, and a search by session key. With tokens, a tenant's `/ui/tree`
holds its own namespace alone and no memory shares.

`LINEAGE_SCREENSHOT_DIR=docs` keeps the page's screenshot there (docs/cache-page.png).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import httpx
import pytest

from clients.bridge.server import bridge_security
from tests.browser import Browser, programs
from tests.clients.bridge.test_bridge import BridgeThread
from tests.clients.bridge.test_bridge_identity import Bridge

SYSTEM = (
    "You are a coding agent working in a Python repository. Read files before you edit "
    "them, keep changes small, run the tests, and report what you changed and why. "
) * 6
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": text,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name, text in (("read_file", "Read a file"), ("run_tests", "Run the tests in a path"))
]


def _turn(http: httpx.Client, namespace: str, session: str, messages: list) -> dict:
    body = {"model": "lineage", "messages": messages, "tools": TOOLS, "max_tokens": 6}
    headers = {"x-session-id": session, "x-cache-namespace": namespace}
    reply = http.post("/v1/chat/completions", json={**body, "temperature": 0}, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _agent_traffic(url: str, namespace: str) -> dict[str, int]:
    """Two sub-agents, two turns each, then a third one whose system prompt changed.
    Returns each session's prompt tokens at its latest turn that kept the system prompt."""
    prompt_end = {}
    with httpx.Client(base_url=url, timeout=120) as http:
        for session, task in (("agent-a", "the parser"), ("agent-b", "the scheduler")):
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Find the bug in {task}."},
            ]
            for follow_up in ("Now fix it.", None):
                body = _turn(http, namespace, session, messages)
                assert body["usage"]["completion_tokens"] > 0
                prompt_end[session] = body["usage"]["prompt_tokens"]
                reply = body["choices"][0]["message"].get("content") or ""
                messages += [{"role": "assistant", "content": reply}]
                if follow_up is None:
                    break
                messages += [{"role": "user", "content": follow_up}]
        changed = [
            {"role": "system", "content": SYSTEM + "Today is Tuesday."},
            {"role": "user", "content": "Find the bug in the parser."},
        ]
        _turn(http, namespace, "agent-c", changed)  # a third sub-agent, the prompt changed
    return prompt_end


# What the page shows, read from its DOM (expressions).
ANCHORS = """[...document.querySelectorAll('#tree details.anchor')].map(a => ({
  title: a.querySelector('summary').textContent,
  sessions: [...a.querySelectorAll('details.conv .sess')].map(s => s.textContent),
}))"""
RESTORE = """Object.fromEntries([...document.querySelectorAll('#tree details.conv')].map(c =>
  [[...c.querySelectorAll('.sess')].map(s => s.textContent).join(','),
   (c.querySelector('.restore') || {}).textContent]))"""
MISSES = """[...document.querySelectorAll('#recent tbody tr')].map(r => r.textContent)"""
SEARCH = """const box = document.getElementById('search'); box.value = arguments[0];
box.dispatchEvent(new Event('input'));
return [...document.querySelectorAll('#tree details.conv .sess')].map(s => s.textContent);"""


@pytest.fixture(scope="module")
def bridge(random_engine):
    if programs() is None:  # before any traffic: nothing to look at
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install them)")
    b = BridgeThread(random_engine)  # the gRPC way: the CacheTree RPC is exercised
    yield b
    b.stop()


def test_the_page_shows_the_anchor_restore_points_and_misses(bridge, tmp_path):
    namespace = f"page-{uuid.uuid4().hex[:8]}"
    prompt_end = _agent_traffic(bridge.url, namespace)
    with Browser() as browser:
        browser.open(f"{bridge.url}/ui?namespace={namespace}")

        try:
            anchors = browser.until(f"return {ANCHORS}.filter(a => a.sessions.length >= 2)")
        except AssertionError:
            text = browser.run("return document.body.innerText")
            data = httpx.get(f"{bridge.url}/ui/tree", params={"namespace": namespace}).text
            raise AssertionError(f"the page shows:\n{text}\nits data:\n{data[:4000]}") from None
        assert len(anchors) == 1, anchors
        assert sorted(anchors[0]["sessions"]) == ["agent-a", "agent-b"], anchors
        assert "anchor #" in anchors[0]["title"], anchors
        assert "2 conversations" in anchors[0]["title"], anchors
        restore = browser.run(f"return {RESTORE}")
        assert restore["agent-b"] == f"reply@{prompt_end['agent-b']}", restore
        misses = browser.until(
            f"return {MISSES}.filter(t => t.includes('the system prompt changed'))"
        )
        assert "agent-c" in misses[0] and "in message 0" in misses[0], misses
        assert browser.run(SEARCH, "agent-b") == ["agent-b"]  # the search keeps one session
        assert browser.run("return document.getElementById('memory').textContent").startswith(
            "limit"
        )
        browser.run(SEARCH, "")
        shot = browser.png()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "cache-page.png").write_bytes(shot)
    keep = os.environ.get("LINEAGE_SCREENSHOT_DIR")
    if keep:
        Path(keep, "cache-page.png").write_bytes(shot)


def test_with_tokens_a_tenant_sees_its_own_namespace_and_no_plan(secured, certs):
    """The page's JSON through a bridge in front of the tenants' engine (its Unix socket)."""
    bridge = Bridge(f"unix:{secured.socket}", bridge_security(secured.config.server), certs.ca)
    try:
        for who in ("alice", "bob"):
            headers = [("authorization", f"Bearer {who}-token")]
            assert bridge.post(headers, [7, 8, 9, 10 if who == "alice" else 11]).status_code == 200
        url = f"{bridge.handle.url}/ui/tree"
        with httpx.Client(timeout=60, verify=certs.ca) as http:
            assert http.get(f"{bridge.handle.url}/ui").status_code == 200  # the page: no data
            assert http.get(url).status_code == 401
            alice = http.get(url, params={"namespace": "bob"}, headers=_bearer("alice-token"))
            everyone = http.get(url, headers=_bearer("op-token"))
    finally:
        bridge.close()
    assert alice.status_code == 200 and everyone.status_code == 200, (alice.text, everyone.text)
    alice, everyone = alice.json(), everyone.json()
    mine = {e["namespace"] for e in alice["entries"]} | {r["namespace"] for r in alice["recent"]}
    assert "alice" in mine and all(n == "alice" or n.startswith("alice/") for n in mine), mine
    assert {"alice", "bob"} <= {e["namespace"] for e in everyone["entries"]}
    assert alice["memory"] == [] and everyone["memory_limit"] > 0


def _bearer(token: str) -> dict:
    return {"authorization": f"Bearer {token}"}
