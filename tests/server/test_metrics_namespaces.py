"""How cache namespaces show in metrics and Inspect: salted, and few.

The tag was 8 hex digits of an unsalted SHA-256, so a dictionary of tenant
names reversed it; and every new namespace made new series, kept forever.
Now the tag is keyed by a secret the server draws at start, it names the root
tenant only (`acme/dev` counts as `acme`), and past a cap new roots share one
`other` tag. The session's engine (Ray, MLX) and Ray's Prometheus export.
"""

from __future__ import annotations

import hashlib
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from clients.client import Client
from engine.config import ServerConfig
from engine.server.observe.activity import OTHER_NAMESPACES


def namespace_tags(port: int, engine_tag: str) -> set[str]:
    """The namespace label values of one engine's lineage_requests_total series."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return set()
    return {
        s.labels.get("namespace", "")
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("ray_lineage_requests_total") and s.labels.get("engine") == engine_tag
    }


def test_the_namespace_tag_is_not_a_plain_hash(engine):
    with Client(engine.address, timeout=120) as c:
        c.generate(prompt_ids=[9, 8, 7], max_tokens=1, namespace="alice", request_id="salt-1")
        (record,) = [r for r in c.inspect(recent=50)["recent"] if r["request_id"] == "salt-1"]
    tag = record["namespace"]
    assert tag and tag != "alice"
    assert tag != hashlib.sha256(b"alice").hexdigest()[:8]  # a dictionary would reverse it
    with Client(engine.address, timeout=120) as c:  # one tag per root tenant
        c.generate(prompt_ids=[9, 8, 7], max_tokens=1, namespace="alice/dev", request_id="salt-2")
        (sub,) = [r for r in c.inspect(recent=50)["recent"] if r["request_id"] == "salt-2"]
    assert sub["namespace"] == tag


def test_namespaces_past_the_cap_share_one_tag(engine, metrics_port):
    cap = ServerConfig().metrics_namespaces
    with Client(engine.address, timeout=120) as c:
        for i in range(cap + 8):
            c.generate(prompt_ids=[4, 5, i % 50 + 1], max_tokens=1, namespace=f"many-{i}")
    tag = engine.config.server.ray_namespace
    deadline = time.monotonic() + 30
    while OTHER_NAMESPACES not in namespace_tags(metrics_port, tag):
        assert time.monotonic() < deadline, namespace_tags(metrics_port, tag)
        time.sleep(0.5)
    # Every root seen in this session, capped, plus the cache-wide "" and "other".
    assert len(namespace_tags(metrics_port, tag) - {"", OTHER_NAMESPACES}) <= cap
