"""The in-process bridge's `model_info` (clients.bridge.in_process) on a stand-in engine:
the figures it reads of the front end, without Ray or a model."""

from __future__ import annotations

import asyncio
import sys
import uuid
from types import SimpleNamespace

from clients.bridge.in_process import InProcessBackend


def _engine(path: str) -> SimpleNamespace:
    info = SimpleNamespace(
        path=path,
        model_type="tiny",
        vocab_size=8,
        max_context=64,
        fingerprint="fp",
        has_state_layers=False,
        kernels=(),
    )
    frontend = SimpleNamespace(
        info=info, builder=SimpleNamespace(output_format="plain"), cache_mode="lineage"
    )
    return SimpleNamespace(auth=SimpleNamespace(enabled=False), frontend=frontend, fleet=None)


def test_the_model_info_of_each_request_interns_no_part_of_the_models_path(monkeypatch):
    """The routes ask `model_info` on every request. A `PurePath` of the model's path each
    time interned its parts anew once the last request's had died (pathlib's parse): the
    interpreter's interned-string table churned a few slots per request until it resized
    (a one-off step of a few MiB in a soak). The name is made once per path."""
    parts = ("models-" + uuid.uuid4().hex[:8], "tiny-" + uuid.uuid4().hex[:8])
    backend = InProcessBackend(_engine(f"/srv/{parts[0]}/{parts[1]}/"))
    loop = asyncio.new_event_loop()
    first = loop.run_until_complete(backend.model_info())
    interned = []
    real = sys.intern
    monkeypatch.setattr(sys, "intern", lambda s: interned.append(s) or real(s))
    for _ in range(3):
        info = loop.run_until_complete(backend.model_info())
    loop.close()
    assert info["id"] == first["id"] == parts[1]
    assert info["reply"]["model"] == parts[1]
    assert [s for s in interned if s in parts] == []
