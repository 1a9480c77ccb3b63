"""Inspection of a running engine: named actors and their logs on the Ray dashboard."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.actors.names import CACHE_MANAGER, model_actor_name


def _address() -> str:
    """This session's dashboard (other Ray instances may run on the machine)."""
    import ray

    return ray.dashboard_address  # set by the ray_session fixture


def _until(check, deadline: float = 20.0, every: float = 0.25):
    """check()'s first truthy value, polled until the deadline (else its last value)."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value or time.monotonic() > end:
            return value
        time.sleep(every)


def test_actors_are_named_in_the_engine_namespace(engine):
    from ray.util.state import list_actors

    namespace = engine.config.server.ray_namespace
    want = sorted([model_actor_name(0), CACHE_MANAGER])

    def alive() -> list:
        actors = list_actors(
            address=_address(),
            filters=[("ray_namespace", "=", namespace), ("state", "=", "ALIVE")],
        )
        return sorted(a.name for a in actors)

    assert _until(lambda: alive() == want) and alive() == want


def test_actor_log_lines_reach_the_dashboard(engine):
    """The model actor's INFO lines are in its worker's .err file, the one the dashboard's
    actor page shows (read here directly: get_log needs the node agent's fixed port, which
    another Ray on the machine may hold)."""
    import ray
    from ray.util.state import list_actors

    namespace = engine.config.server.ray_namespace
    (model,) = list_actors(
        address=_address(),
        filters=[("ray_namespace", "=", namespace), ("name", "=", model_actor_name(0))],
    )
    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())

    def started() -> bool:
        text = "".join(p.read_text() for p in logs.glob(f"worker-*-{model.pid}.err"))
        return "model actor started" in text

    assert _until(started)


_LABELS = ("kind", "tier", "reason", "code")  # the labels the checks below look at


def _scrape(port: int, engine_tag: str) -> dict:
    """{(sample name, frozenset of labels but engine): value} of one engine's lineage series."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "lineage_" in s.name and s.labels.get("engine") == engine_tag:
                keep = {k: v for k, v in s.labels.items() if k in _LABELS}
                key = (s.name, frozenset(keep.items()))
                out[key] = out.get(key, 0.0) + s.value  # summed over replicas, namespaces
    return out


def _figures(samples: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def test_metrics_match_cache_stats(engine, metrics_port):
    """After a few requests, Ray's Prometheus export shows lineage_ metrics equal to CacheStats."""
    from clients.client import Client, LineageError

    messages = [{"role": "system", "content": "You inspect engines."}]
    with Client(engine.address) as client:
        for turn in ("first question", "first question", "second question"):
            client.generate(messages=messages + [{"role": "user", "content": turn}], max_tokens=4)
        with pytest.raises(LineageError):  # counted as INVALID_ARGUMENT
            client.generate(prompt="x", max_tokens=2, stop_token_ids=[10**8])
        stats = client.cache_stats()
    tag = engine.config.server.ray_namespace

    def expected() -> dict:
        out = {("ray_lineage_restores_total", (("kind", k),)): v for k, v in stats["hits"].items()}
        out[("ray_lineage_entries", ())] = stats["entries"]
        out[("ray_lineage_anchors", ())] = stats["anchors"]
        out[("ray_lineage_tier_bytes", (("tier", "ram"),))] = stats["ram_bytes"]
        out[("ray_lineage_tier_bytes", (("tier", "anchors"),))] = stats["anchor_bytes"]
        out[("ray_lineage_flight_waits_total", ())] = stats.get("flight_waits", 0)
        return out

    def seen() -> dict:
        samples = _scrape(metrics_port, tag)
        return {key: _figures(samples, key[0], **dict(key[1])) for key in expected()}

    assert _until(lambda: seen() == expected(), deadline=30)
    samples = _scrape(metrics_port, tag)
    assert _figures(samples, "ray_lineage_requests_total", reason="length") >= 3
    assert _figures(samples, "ray_lineage_ttft_ms_count") >= 3
    assert _figures(samples, "ray_lineage_tokens_total", kind="cached") > 0
    assert _figures(samples, "ray_lineage_tier_budget_bytes", tier="ram") == (
        engine.config.cache.ram_budget
    )
    assert _figures(samples, "ray_lineage_mlx_peak_bytes") > 0
    assert _figures(samples, "ray_lineage_errors_total", code="INVALID_ARGUMENT") >= 1


def test_final_event_carries_the_trace_and_inspect_lists_it(engine):
    """The final event names the request and the replica that served it; Inspect shows both."""
    from clients.client import Client

    with Client(engine.address) as client:
        result = client.generate(prompt="trace me", max_tokens=3, request_id="trace-1")
        live = client.inspect(recent=5)
    assert (result.request_id, result.replica) == ("trace-1", "0")
    (record,) = [r for r in live["recent"] if r["request_id"] == "trace-1"]
    assert record["replica"] == "0" and record["completion_tokens"] == 3
    assert record["prompt_tokens"] == result.usage.prompt_tokens
    assert [r["name"] for r in live["replicas"]] == ["0"]
    assert {t["tier"] for t in live["tiers"]} == {"ram", "anchors", "disk"}
    assert sum(k["requests"] for k in live["window"]) >= 1


def test_lineage_top_once_renders_against_a_real_server(engine):
    """`lineage top --once`, headless: a rich Console in record mode holds the frame."""
    import argparse

    from rich.console import Console

    from clients.cli import top
    from clients.client import Client

    system = "You are a careful agent. " * 20
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "go"}]
    with Client(engine.address) as client:
        reply = client.generate(messages=messages, max_tokens=3, namespace="tenant-a").text
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "on"}]
        client.generate(messages=messages, max_tokens=3, namespace="tenant-a")
    console = Console(record=True, width=160, force_terminal=False)
    args = argparse.Namespace(server=engine.address, once=True, requests=10, interval=1.0, model="")
    assert top.run(args, console) == 0
    frame = console.export_text()
    for heading in ("replicas", "bytes per tier", "anchors", "restores over the last 60 s"):
        assert heading in frame
    assert "latest requests" in frame and "tenant-a" not in frame  # namespaces are hashed
    assert top.format_bytes(engine.config.cache.ram_budget) in frame  # the RAM budget bar
    tag = engine.engine.frontend.namespaces.tag("tenant-a")
    anchor_rows = [line for line in frame.splitlines() if tag in line and "KiB" in line]
    assert anchor_rows  # the tenant's anchor, with its bytes and sessions
    warm = [line for line in frame.splitlines() if tag in line and " none " not in line]
    assert len(warm) >= 2  # the anchor row and the warm turn's request row
