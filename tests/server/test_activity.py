"""The front end's record of recent requests and the figures over its window (no Ray)."""

from __future__ import annotations

import hashlib

import pytest

from engine.cache.kinds import RestoreKind
from engine.runtime.events import Finished, FinishReason, Timing
from engine.server.observe.activity import OTHER_NAMESPACES, Activity, NamespaceTags


def finished(rid: str, kind: str, prompt: int, cached: int, out: int, ttft: float, replica="0"):
    return Finished(
        rid,
        FinishReason.STOP,
        prompt,
        cached,
        out,
        RestoreKind(kind),
        cached,
        Timing(ttft_ms=ttft),
        replica=replica,
    )


@pytest.mark.parametrize(
    "namespace, how, shown",
    [
        ("", "hash", ""),
        ("acme", "plain", "acme"),
        ("acme/dev", "plain", "acme"),  # the root tenant only
        ("acme", "off", ""),
    ],
)
def test_namespace_tag(namespace, how, shown):
    assert NamespaceTags(how).tag(namespace) == shown


def test_hashed_tags_are_keyed_per_server_and_capped():
    a, b = NamespaceTags(cap=2), NamespaceTags(cap=2)
    assert len(a.tag("acme")) == 8 and a.tag("acme") == a.tag("acme/dev")
    assert a.tag("acme") != b.tag("acme")  # another server, another key
    assert a.tag("acme") != hashlib.sha256(b"acme").hexdigest()[:8]
    assert NamespaceTags(key=b"k").tag("acme") == NamespaceTags(key=b"k").tag("acme")
    a.tag("beta")
    assert a.tag("gamma") == a.tag("delta") == OTHER_NAMESPACES  # past the cap
    assert a.tag("beta/x") == a.tag("beta") != OTHER_NAMESPACES


def test_window_by_kind_and_replica_rates():
    a = Activity(keep=3, window_s=60)
    a.record(finished("old", "none", 100, 0, 10, 900.0), "", at=0.0)  # outside the window
    a.record(finished("r1", "none", 100, 0, 30, 300.0), "", at=100.0)
    a.record(finished("r2", "entry", 100, 90, 30, 10.0), "", at=110.0)
    a.record(finished("r3", "entry", 50, 40, 0, 0.0, replica="1"), "", at=115.0)
    assert [r.request_id for r in a.latest(5)] == ["r3", "r2", "r1"]  # "old" fell out (keep=3)
    kinds = {k.kind: (k.requests, k.cached_tokens, k.prompt_tokens) for k in a.by_kind(120.0)}
    assert kinds == {"none": (1, 0, 100), "entry": (2, 130, 150)}
    assert a.rates("0", 120.0) == (60 / 60, 155.0)  # tokens/s over the window, median TTFT
    assert a.rates("1", 120.0) == (0.0, 0.0)  # no token: no TTFT
