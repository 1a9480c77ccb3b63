"""A probe that shares a prompt's start learns nothing finer than a block.

Alice's token, her own namespace: what a co-tenant holding her token sees. For
several common-prefix lengths inside one 64-token block, a probe plants a
divergence checkpoint at that length and a second probe restores there. Every
figure the API returns for the second probe, over gRPC and through the
bridge (usage, restore, timing, prefill progress, the OpenAI fields and the
SSE progress comments), must be the same for every length in the block: only
the block shows. The clock-only figures (time to first token and decode
speed) are what a client's own clock measures, and are left out. The same
probes on the session's exact-figures (random-weight) engine do tell the lengths apart.
"""

from __future__ import annotations

import dataclasses
import json

import httpx

from clients.bridge.server import bridge_security, start_bridge
from clients.client import Client, Final, Progress
from engine.config import CACHE_BLOCK
from engine.server.running.background import BackgroundLoop

SECRET = [(i * 41 + 17) % 480 + 9 for i in range(600)]
# Common prefixes inside one block: a probe must not tell them apart.
LENGTHS = (5 * CACHE_BLOCK + 3, 5 * CACHE_BLOCK + 20, 5 * CACHE_BLOCK + 47, 6 * CACHE_BLOCK - 2)
CLOCK = ("ttft_ms", "decode_tps")  # what the client's own clock shows


def probe_prompt(k: int, seed: int) -> list[int]:
    return SECRET[:k] + [(i * 13 + 7 + seed) % 400 + 600 for i in range(600 - k)]


def grpc_figures(c: Client, prompt: list[int], namespace: str) -> tuple:
    """Everything a Generate stream tells, but its request id and the clock."""
    events = list(c.stream(prompt_ids=prompt, max_tokens=1, namespace=namespace, seed=1))
    final = events[-1]
    assert isinstance(final, Final)
    timing = {k: v for k, v in dataclasses.asdict(final.timing).items() if k not in CLOCK}
    progress = [(e.done, e.total) for e in events if isinstance(e, Progress)]
    return (final.finish_reason, final.usage, final.restore, timing, progress, final.replica)


def bridge_figures(http: httpx.Client, url: str, prompt: list[int], namespace: str) -> tuple:
    """Everything a streamed OpenAI completion tells: its usage and the SSE comments."""
    body = {
        "model": "lineage",
        "prompt": prompt,
        "max_tokens": 1,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"authorization": "Bearer alice-token", "x-cache-namespace": namespace}
    comments, usage = [], None
    with http.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith(":"):
                comments.append(line)
            elif line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
    return (usage, comments)


def run_probes(figures, namespace_of) -> dict[int, tuple]:
    """For each length: the secret, a probe that plants a point there, and the one we read."""
    seen = {}
    for k in LENGTHS:
        namespace = namespace_of(k)
        figures(SECRET, namespace)
        figures(probe_prompt(k, 0), namespace)
        seen[k] = figures(probe_prompt(k, 1), namespace)
    return seen


def test_every_figure_a_probe_sees_depends_on_the_block_alone(secured, certs, random_engine):
    with Client(secured.address, auth_token="alice-token", tls_ca=certs.ca, timeout=120) as c:
        seen = run_probes(lambda p, ns: grpc_figures(c, p, ns), lambda k: f"grpc-{k}")
    assert all(f[2].length == 5 * CACHE_BLOCK for f in seen.values()), seen
    assert len(set(map(repr, seen.values()))) == 1, seen

    loop = BackgroundLoop("probe-bridge")
    security = bridge_security(secured.config.server)
    handle = loop.call(start_bridge(f"unix:{secured.socket}", "127.0.0.1", 0, security))
    try:
        with httpx.Client(verify=certs.ca, timeout=120) as http:
            seen = run_probes(
                lambda p, ns: bridge_figures(http, handle.url, p, ns), lambda k: f"http-{k}"
            )
    finally:
        loop.call(handle.stop(grace=1.0))
        loop.close()
    usage = next(iter(seen.values()))[0]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 5 * CACHE_BLOCK, seen
    assert len(set(map(repr, seen.values()))) == 1, seen

    # Exact figures (the session's engine) tell every length apart: the test can see.
    with Client(random_engine.address, timeout=120) as exact:
        seen = run_probes(lambda p, ns: grpc_figures(exact, p, ns), lambda k: f"exact-{k}")
    assert sorted(f[2].length for f in seen.values()) == list(LENGTHS), seen
