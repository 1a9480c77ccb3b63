"""Warm restarts through the running server: real Ray, MLX, gRPC and entry files.

One engine serves a conversation turn and is stopped; a second engine on the
same cache directory (with damaged files planted in it) serves the next turn
from the first one's files; a third, after the weight file was touched, misses.
"""

from __future__ import annotations

import json
import os

from clients.client import Client
from clients.fanout import make_shared_prefix, user_message
from engine.server.running.background import BackgroundEngine
from tests.engines import make_config

SYSTEM, TOOLS = make_shared_prefix(900, seed=11)


def convo(*users):
    return [{"role": "system", "content": SYSTEM}] + [{"role": "user", "content": u} for u in users]


def chat(client, messages, max_tokens=6):
    return client.generate(messages=messages, tools=TOOLS, max_tokens=max_tokens)


def stop(engine: BackgroundEngine) -> None:
    """Stop an engine once its disk writer has written every file ordered."""
    import ray

    try:
        assert ray.get(engine.engine.model.flush_disk.remote(60), timeout=90)
    finally:
        engine.stop()


def plant_damaged_files(entries) -> int:
    """Copies of a real file, truncated, bit-flipped, of a future format, and garbage."""
    raw = next(entries.glob("*.entry")).read_bytes()
    flipped = bytearray(raw)
    flipped[40] ^= 0x04
    future = bytearray(raw)
    future[8:12] = (99).to_bytes(4, "little")
    planted = {
        "9001": raw[: len(raw) // 2],
        "9002": bytes(flipped),
        "9003": bytes(future),
        "9004": b"\0" * 100,
    }
    for name, data in planted.items():
        (entries / f"{name}.entry").write_bytes(data)
    return len(planted)


def test_restart_is_warm_skips_damaged_files_and_a_touched_model_misses(
    ray_session, tmp_path, capsys
):
    config = make_config(tmp_path)
    entries = tmp_path / "entries"
    first = convo(user_message(0, 0))
    engine = BackgroundEngine(config)
    try:
        with Client(engine.address, timeout=120) as client:
            r1 = chat(client, first)
            budgeted = client.cache_stats()["disk_bytes"]
    finally:
        stop(engine)
    files = list(entries.glob("*.entry"))
    assert len(files) == 2  # the conversation and its anchor
    assert sum(f.stat().st_size for f in files) <= budgeted, "the budget counts files' upper bound"
    damaged = plant_damaged_files(entries)

    engine = BackgroundEngine(config)
    try:
        with Client(engine.address, timeout=120) as client:
            stats = client.cache_stats()
            assert (stats["disk_entries"], stats["damaged_files"]) == (2, damaged)
            second = first + [
                {"role": "assistant", "content": r1.text},
                {"role": "user", "content": user_message(0, 1)},
            ]
            r2 = chat(client, second)
            assert r2.usage.cached_tokens >= r1.usage.prompt_tokens - 16
            assert r2.restore.kind in ("entry", "reply", "final")
            r3 = chat(client, convo("A fresh session's first question about parsers."))
            assert r3.restore.kind == "anchor", "the anchor written before the restart"
            assert r3.usage.cached_tokens >= r1.usage.prompt_tokens - 40
        assert engine.generator_stats().disk["loads"] == 2
        from clients.cli.main import main

        assert main(["cache", "stats", "--server", engine.address, "--json"], env={}) == 0
        assert json.loads(capsys.readouterr().out)["damaged_files"] == damaged
    finally:
        stop(engine)

    weights = next((tmp_path / "models").glob("*/model.safetensors"))
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    engine = BackgroundEngine(config)
    try:
        with Client(engine.address, timeout=120) as client:
            stats = client.cache_stats()
            assert stats["disk_entries"] == 0 and stats["disk_bytes"] > 0  # all foreign now
            r4 = chat(client, second)
            assert (r4.usage.cached_tokens, r4.restore.kind) == (0, "none")
    finally:
        engine.stop()
