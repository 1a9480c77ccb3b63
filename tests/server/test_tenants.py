"""Tenants that cannot read each other, end to end.

One engine with tokens, TLS and rounded cache figures, on real gRPC, Ray and
MLX: a TLS round trip with the Python client and with the `openai` client
through the bridge, 401 without a token, namespaces from tokens, and a probe
that learns nothing finer than a 64-token block about a prompt it shares.
"""

from __future__ import annotations

import dataclasses

import httpx
import openai
import pytest

from clients.bridge.server import bridge_security, start_bridge
from clients.client import Client, Final, LineageError, Progress
from engine.config import CACHE_BLOCK
from engine.server.running.background import BackgroundLoop

SECRET = [(i * 37 + 11) % 500 + 3 for i in range(600)]  # alice's prompt (token ids)
# Common prefixes the probes try. On a hybrid model the first probe at k plants a
# divergence checkpoint at k and the second restores there: exactly k, unrounded.
PREFIXES = (300, 331, 390)


def client(engine, token, certs) -> Client:
    return Client(engine.address, auth_token=token, tls_ca=certs.ca, timeout=120)


def probe(c: Client, prompt: list[int], namespace: str = "") -> tuple[Final, list]:
    events = list(c.stream(prompt_ids=prompt, max_tokens=1, namespace=namespace))
    final = events[-1]
    assert isinstance(final, Final)
    return final, [e for e in events if isinstance(e, Progress)]


def _tail(n: int, seed: int = 0) -> list[int]:
    return [(i * 13 + 7 + seed) % 400 + 600 for i in range(n)]


def probes(k: int) -> list[list[int]]:
    return [SECRET[:k] + _tail(600 - k, seed) for seed in (0, 1)]


def test_python_client_round_trip_over_tls_with_a_token(secured, certs):
    with client(secured, "alice-token", certs) as c:
        result = c.generate(prompt_ids=[5, 6, 7, 8], max_tokens=3)
        assert result.usage.completion_tokens >= 1
        assert "/" not in c.model_info()["model"]
    with client(secured, None, certs) as c:
        with pytest.raises(LineageError) as err:
            c.generate(prompt_ids=[5, 6], max_tokens=1)
        assert err.value.code == "UNAUTHENTICATED"


def test_a_probe_learns_nothing_finer_than_a_block(secured, certs, engine):
    """Alice's own namespace: what a co-tenant with her token could see."""
    with client(secured, "alice-token", certs) as c:
        probe(c, SECRET)
        restored = []
        for k in PREFIXES:
            for prompt in probes(k):
                final, progress = probe(c, prompt)
                figures = (final.usage.cached_tokens, final.restore.length)
                assert all(f % CACHE_BLOCK == 0 for f in figures), (k, figures)
                assert all(p.done % CACHE_BLOCK == 0 or p.done == p.total for p in progress)
                restored.append(final.restore.length)
        assert any(restored), "the probes restored nothing: the test shows nothing"
    # The same probes on an engine that reports exact figures do show finer lengths:
    # the rounding above is what hides them.
    with Client(engine.address) as exact:
        exact.generate(prompt_ids=SECRET, max_tokens=1, namespace="exact-probe")
        lengths = {
            exact.generate(prompt_ids=prompt, max_tokens=1, namespace="exact-probe").restore.length
            for k in PREFIXES
            for prompt in probes(k)
        }
    assert any(n % CACHE_BLOCK for n in lengths), lengths


def test_namespaces_come_from_tokens(secured, certs):
    with client(secured, "alice-token", certs) as alice:
        probe(alice, SECRET[:300] + _tail(50))
    with client(secured, "bob-token", certs) as bob:
        for namespace in ("", "alice", "../alice"):
            try:
                final, _ = probe(bob, SECRET[:300] + _tail(60), namespace)
            except LineageError as e:  # a namespace outside the charset
                assert e.code == "INVALID_ARGUMENT"
                continue
            assert final.usage.cached_tokens == 0, namespace  # never alice's entries
        with pytest.raises(LineageError) as err:
            bob.cache_stats()
        assert err.value.code == "PERMISSION_DENIED"
    with client(secured, "op-token", certs) as op:
        assert op.cache_stats()["entries"] >= 1


def test_openai_client_through_the_bridge_over_tls(secured, certs):
    loop = BackgroundLoop("bridge-tls")
    handle = loop.call(
        start_bridge(
            f"unix:{secured.socket}", "127.0.0.1", 0, bridge_security(secured.config.server)
        )
    )
    try:
        assert handle.url.startswith("https://")

        def https():
            return httpx.Client(verify=certs.ca, timeout=120)

        with openai.OpenAI(
            base_url=f"{handle.url}/v1", api_key="alice-token", max_retries=0, http_client=https()
        ) as oa:
            reply = oa.completions.create(model="lineage", prompt=[5, 6, 7], max_tokens=2)
            assert reply.usage.completion_tokens >= 1
            cached = reply.usage.prompt_tokens_details
            assert cached is None or (cached.cached_tokens or 0) % CACHE_BLOCK == 0
        with openai.OpenAI(
            base_url=f"{handle.url}/v1", api_key="wrong", max_retries=0, http_client=https()
        ) as oa:
            with pytest.raises(openai.AuthenticationError):
                oa.models.list()
        with https() as http:
            r = http.get(f"{handle.url}/v1/models")
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert http.get(f"{handle.url}/health").status_code == 200  # probes stay open
    finally:
        loop.call(handle.stop(grace=1.0))
        loop.close()


@pytest.fixture(scope="module")
def in_process_bridge(secured):
    """The bridge as `lineage serve --http-port` starts it: in the engine's own process,
    calling its front end (clients.bridge.in_process), with the engine's tokens and TLS."""
    from clients.cli.serve import bridge_sidecar

    server = dataclasses.replace(secured.config.server, host="127.0.0.1", http_port=0)
    start = bridge_sidecar(dataclasses.replace(secured.config, server=server), quiet=True)
    handle = secured.call(start(secured.engine))
    yield handle
    secured.call(handle.stop(grace=1.0))


def test_the_in_process_bridge_takes_the_namespace_from_the_token(in_process_bridge, certs):
    from clients.bridge.in_process import InProcessBackend

    assert isinstance(in_process_bridge.backend, InProcessBackend)  # no gRPC hop
    url = f"{in_process_bridge.url}/v1"

    def oa(token: str) -> openai.OpenAI:
        http = httpx.Client(verify=certs.ca, timeout=120)
        return openai.OpenAI(base_url=url, api_key=token, max_retries=0, http_client=http)

    prompt = [(i * 29 + 5) % 400 + 3 for i in range(400)]
    with oa("alice-token") as alice:
        alice.completions.create(model="lineage", prompt=prompt, max_tokens=1)
        again = alice.completions.create(model="lineage", prompt=prompt + [9], max_tokens=1)
        cached = again.usage.prompt_tokens_details.cached_tokens
        assert cached >= CACHE_BLOCK and cached % CACHE_BLOCK == 0  # hers, rounded
    with oa("bob-token") as bob:  # asking for alice's namespace lands in bob's own
        reply = bob.completions.create(
            model="lineage",
            prompt=prompt + [9],
            max_tokens=1,
            extra_headers={"X-Cache-Namespace": "alice"},
        )
        assert (reply.usage.prompt_tokens_details.cached_tokens or 0) == 0
    with oa("wrong") as nobody:
        with pytest.raises(openai.AuthenticationError):
            nobody.completions.create(model="lineage", prompt=[5, 6], max_tokens=1)


def test_request_ids_are_scoped_by_namespace(secured, certs):
    """Bob can neither see nor block an id alice has in flight; alice cannot reuse hers."""
    with client(secured, "alice-token", certs) as alice, client(secured, "bob-token", certs) as bob:
        held = alice.stream(prompt_ids=[5, 6, 7], max_tokens=4000, request_id="shared-id")
        assert not isinstance(next(held), Final)  # in flight
        try:
            result = bob.generate(prompt_ids=[5, 6, 7], max_tokens=2, request_id="shared-id")
            assert result.request_id == "shared-id" and result.usage.completion_tokens >= 1
            with pytest.raises(LineageError) as err:
                alice.generate(prompt_ids=[5, 6], max_tokens=1, request_id="shared-id")
            assert err.value.code == "INVALID_ARGUMENT"
        finally:
            held.cancel()


def test_tokens_never_reach_the_actors(secured):
    """The model actor's configuration (also kept in Ray's GCS to restart it) has no token."""
    import ray

    def tokens_held(actor) -> list[str]:
        return [i.token for i in actor.loop.generator.config.server.tokens]

    assert ray.get(secured.engine.model.__ray_call__.remote(tokens_held), timeout=60) == []
