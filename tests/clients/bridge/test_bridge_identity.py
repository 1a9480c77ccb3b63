"""The bridge's identity: who a caller is at the bridge is who the engine serves.

Real bridges in front of real engines (gRPC, Ray, MLX): the tenants' engine of
conftest (tokens for an operator, alice and bob) and the session's open engine.
The operator's token sits in the bridge's environment, as cluster.yaml puts it
there, so any call the bridge made with it would be served as the admin.
"""

from __future__ import annotations

import httpx
import pytest

from clients.bridge.server import bridge_security, start_bridge
from clients.client import Client
from engine.config import ServerConfig
from engine.server.running.background import BackgroundLoop
from tests.conftest import TENANT_TOKENS

BOBS = [(i * 29 + 5) % 480 + 7 for i in range(400)]  # bob's prompt (token ids)


class Bridge:
    """A bridge on a free port, from a loop of its own; `post` sends raw headers."""

    def __init__(self, grpc_address: str, security=None, verify=True):
        self.verify = verify  # the CA of a TLS bridge
        self.loop = BackgroundLoop("bridge-identity")
        try:
            self.handle = self.loop.call(start_bridge(grpc_address, "127.0.0.1", 0, security))
        except BaseException:
            self.loop.close()
            raise

    def post(self, headers: list[tuple[str, str]], prompt: list[int], **body) -> httpx.Response:
        body = {"model": "lineage", "prompt": prompt, "max_tokens": 1, **body}
        with httpx.Client(timeout=120, verify=self.verify) as http:
            return http.post(
                f"{self.handle.url}/v1/completions", headers=httpx.Headers(headers), json=body
            )

    def close(self) -> None:
        try:
            self.loop.call(self.handle.stop(grace=0.5))
        finally:
            self.loop.close()


def cached(reply: httpx.Response) -> int:
    assert reply.status_code == 200, reply.text
    details = reply.json()["usage"].get("prompt_tokens_details") or {}
    return details.get("cached_tokens") or 0


@pytest.fixture
def operator_token_in_environment(monkeypatch):
    monkeypatch.setenv("LINEAGE_AUTH_TOKEN", "op-token")


def test_a_tenant_cannot_pass_one_token_and_forward_another(
    secured, certs, operator_token_in_environment
):
    """Two Authorization headers: the bridge checked the last and forwarded the first, which
    the gRPC client replaced with the environment's admin token: alice read bob's cache."""
    with Client(secured.address, auth_token="bob-token", tls_ca=certs.ca, timeout=120) as bob:
        bob.generate(prompt_ids=BOBS, max_tokens=1)
    bridge = Bridge(
        f"unix:{secured.socket}", bridge_security(secured.config.server), verify=certs.ca
    )
    try:
        two = [("authorization", "Basic eA=="), ("authorization", "Bearer alice-token")]
        reply = bridge.post([*two, ("x-cache-namespace", "bob")], BOBS)
        assert reply.status_code == 400, (reply.status_code, reply.text)
        assert "authorization" in reply.json()["error"]["message"].lower()
        # One header: alice, in her own namespace whatever she names.
        mine = [("authorization", "Bearer alice-token"), ("x-cache-namespace", "bob")]
        assert cached(bridge.post(mine, BOBS)) == 0
        assert cached(bridge.post([("authorization", "Bearer bob-token")], BOBS)) > 0
    finally:
        bridge.close()


@pytest.mark.parametrize("headers", [[], [("authorization", "Basic eA==")]], ids=["none", "basic"])
def test_the_bridge_never_sends_its_environments_token_for_a_caller(
    secured, operator_token_in_environment, headers
):
    """A bridge without tokens of its own passes the caller's token on, and no other."""
    bridge = Bridge(f"unix:{secured.socket}", bridge_security(ServerConfig()))
    try:
        reply = bridge.post(headers, [5, 6, 7])
        assert reply.status_code == 401, (reply.status_code, reply.text)
        assert cached(bridge.post([("authorization", "Bearer alice-token")], [5, 6, 7])) >= 0
    finally:
        bridge.close()


def test_tenant_tokens_in_front_of_an_open_engine_are_refused_at_start(engine, tmp_path, capsys):
    """The README's standalone bridge: tenants at the bridge, none at the engine, so the
    engine would take any namespace a tenant names."""
    from clients.cli.main import main

    tenants = ServerConfig(tokens=TENANT_TOKENS)
    with pytest.raises(ValueError, match="allow-open-engine"):
        Bridge(engine.address, bridge_security(tenants))
    tokens = tmp_path / "tokens"
    tokens.write_text("op-token\nalice-token alice\n")
    command = ["bridge", "--server", engine.address, "--port", "0"]
    assert main([*command, "--auth-token-file", str(tokens)], env={}) == 2
    assert "--allow-open-engine" in capsys.readouterr().err


def test_with_tenant_tokens_the_bridge_takes_the_namespace_from_the_token(engine):
    """Allowed in front of an open engine, the bridge places a tenant itself."""
    with Client(engine.address, timeout=120) as anyone:
        anyone.generate(prompt_ids=BOBS, max_tokens=1, namespace="bob")
        anyone.generate(prompt_ids=BOBS, max_tokens=1, namespace="carol")
    tenants = ServerConfig(tokens=TENANT_TOKENS, allow_open_engine=True)
    bridge = Bridge(engine.address, bridge_security(tenants))
    try:
        alice = [("authorization", "Bearer alice-token")]
        assert cached(bridge.post([*alice, ("x-cache-namespace", "bob")], BOBS)) == 0
        assert cached(bridge.post(alice, BOBS, user="carol")) == 0
        # She ran in alice/bob, her own sub-namespace: there it is.
        with Client(engine.address, timeout=120) as anyone:
            result = anyone.generate(prompt_ids=BOBS, max_tokens=1, namespace="alice/bob")
        assert result.usage.cached_tokens > 0
        # The operator names any namespace.
        op = [("authorization", "Bearer op-token"), ("x-cache-namespace", "bob")]
        assert cached(bridge.post(op, BOBS)) > 0
    finally:
        bridge.close()
