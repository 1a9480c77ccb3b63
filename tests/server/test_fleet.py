"""Several models behind one server (engine.server.running.fleet), on the session's Ray.

- two models (the embedded qwen3_next and a random-weight kimi_linear) answer by name and
  alias through OpenAI chat, Anthropic Messages, Responses and gRPC at the same time;
  `/v1/models` lists them with their state; an unknown name is a 404 naming them;
- with a plan that fits a pinned model and one other, alternating requests swap the two
  others, a conversation restores from the disk tier after a swap back, and an idle
  model is unloaded (its actor process gone) while the pinned one stays.

Two models on the two nodes of a cluster: tests/server/cluster_fleet.py, which
tests/server/test_replicas.py runs in a process of its own.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time

import pytest

from clients.client import Client, LineageError, Progress
from engine.config import FleetConfig, ModelSpec
from tests.engines import make_config

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory):
    from engine.runtime.model.tiny_models import write_model_dir

    return write_model_dir("kimi_linear", tmp_path_factory.mktemp("random-kimi_linear"))


def fleet_config(cache_dir, models, aliases=(), **fleet):
    config = make_config(cache_dir)
    config = dataclasses.replace(config, fleet=FleetConfig(models=models, **fleet))
    return config.with_server(model_alias=aliases)


@pytest.fixture(scope="module")
def two_models(ray_session, tmp_path_factory, kimi_dir):
    from clients.bridge.app import BridgeOptions
    from clients.bridge.in_process import InProcessBackend
    from clients.bridge.server import start_bridge
    from engine.server.running.background import BackgroundEngine

    models = (ModelSpec("tiny", None), ModelSpec("hybrid", str(kimi_dir)))
    aliases = ("claude-*haiku*=hybrid", "claude-*=tiny", "gpt-*=hybrid")
    engine = BackgroundEngine(fleet_config(tmp_path_factory.mktemp("fleet"), models, aliases))
    backend = InProcessBackend(engine.engine)
    bridge = engine.call(start_bridge(backend, "127.0.0.1", 0, options=BridgeOptions()))
    yield engine, bridge.url
    engine.call(bridge.stop())
    engine.stop()


def test_two_models_answer_by_name_and_alias_in_every_wire_format(two_models, caplog):
    import httpx

    engine, url = two_models
    client = Client(engine.address)
    listed = httpx.get(f"{url}/v1/models").json()["data"]
    states = {m["id"]: (m["state"], m["routes_to"]) for m in listed}
    assert states == {
        "tiny": ("loaded", "tiny"),
        "hybrid": ("loaded", "hybrid"),
        "claude-*haiku*": ("loaded", "hybrid"),
        "claude-*": ("loaded", "tiny"),
        "gpt-*": ("loaded", "hybrid"),
    }

    def chat(model):
        body = {"model": model, "messages": HI, "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
        return reply["model"], reply["usage"]["completion_tokens"]

    def anthropic(model):
        body = {"model": model, "messages": HI, "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{url}/v1/messages", json=body, timeout=120).json()
        return reply["model"], reply["usage"]["output_tokens"]

    def responses(model):
        body = {"model": model, "input": "Say hello.", "max_output_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{url}/v1/responses", json=body, timeout=120).json()
        return reply["model"], reply["usage"]["output_tokens"]

    def grpc(model):
        result = client.generate(HI, max_tokens=4, model=model, temperature=0)
        return model, result.usage.completion_tokens

    calls = [
        (chat, "tiny"),
        (chat, "gpt-5-codex"),
        (anthropic, "claude-3-5-haiku-latest"),
        (anthropic, "claude-sonnet-4-5"),
        (responses, "hybrid"),
        (responses, "claude-opus-4"),
        (grpc, "hybrid"),
        (grpc, "tiny"),
    ]
    with caplog.at_level(logging.INFO, logger="lineage.request"):
        with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
            answers = list(pool.map(lambda c: c[0](c[1]), calls))
    # Greedy: at a sampled temperature the trained model may end a reply before its
    # first token, and the check below is that every call reached its model and decoded.
    assert [a[0] for a in answers] == [model for _, model in calls]  # replies carry the name
    assert all(a[1] > 0 for a in answers), answers
    lines = [r.getMessage() for r in caplog.records if r.name == "lineage.request"]
    served = sorted(line.split(" model=")[1].split()[0] for line in lines)
    assert served == ["hybrid"] * 4 + ["tiny"] * 4  # as the names and aliases route them
    for model in ("hybrid", "tiny", "claude-3-5-haiku"):  # each model's own figures
        assert len(client.inspect(20, model)["recent"]) == 4

    # An unknown name: 404 in each wire format, naming the models; NOT_FOUND over gRPC.
    body = {"model": "llama-3", "messages": HI, "max_tokens": 4}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 404 and "hybrid" in answer.json()["error"]["message"]
    answer = httpx.post(f"{url}/v1/messages", json=body, timeout=60)
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "not_found_error"
    with pytest.raises(LineageError) as error:
        client.generate(HI, max_tokens=4, model="llama-3")
    assert error.value.code == "NOT_FOUND" and "tiny (loaded)" in error.value.message
    client.close()


def _actor_rss(namespace: str) -> dict[str, int]:
    """VmRSS (bytes) of the live actor processes of a Ray namespace, by actor name."""
    import ray
    from ray.util.state import list_actors

    filters = [("ray_namespace", "=", namespace), ("state", "=", "ALIVE")]
    actors = list_actors(address=ray.dashboard_address, filters=filters)
    out = {}
    for actor in actors:
        try:
            status = open(f"/proc/{actor.pid}/status").read()
        except FileNotFoundError:
            continue
        kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
        out[actor.name] = int(kb) * 1024
    return out


def test_swap_restore_from_disk_idle_unload_and_pin(
    ray_session, tmp_path_factory, kimi_dir, random_model_dir
):
    from engine.server.running.background import BackgroundEngine

    models = (
        ModelSpec("pinned", None),
        ModelSpec("a", str(random_model_dir)),
        ModelSpec("b", str(kimi_dir)),
    )
    config = fleet_config(
        tmp_path_factory.mktemp("swaps"), models, pin=("pinned",), idle_unload=6.0
    )
    # Each model's plan: a 64 MiB RAM tier (+ a 16 MiB pool), 2048 running tokens, 4
    # grammars: about 100 MiB. The limit fits the pinned model and one other.
    config = config.with_cache(ram_budget=64 << 20, memory_limit=260 << 20)
    config = config.with_model(max_batch_tokens=2048, grammar_cache=4)
    engine = BackgroundEngine(config)
    client = Client(engine.address)
    fleet = engine.engine.fleet
    namespace = config.server.ray_namespace

    def states():
        return {m["name"]: m["state"] for m in client.model_info()["models"]}

    try:
        assert states() == {"pinned": "loaded", "a": "loaded", "b": "unloaded"}
        talk = [{"role": "user", "content": "Tell me about the sea. " * 20}]
        first = client.generate(talk, max_tokens=8, model="a")
        talk += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "More"}]
        # b needs a's room: a is unloaded (its disk writes flushed), b loads while the
        # request waits with Progress events.
        events = list(client.stream(HI, max_tokens=4, model="b"))
        assert any(isinstance(e, Progress) for e in events)
        assert states() == {"pinned": "loaded", "a": "unloaded", "b": "loaded"}
        # Back to a: b goes, a's conversation restores from its disk tier.
        again = client.generate(talk, max_tokens=4, model="a")
        assert states() == {"pinned": "loaded", "a": "loaded", "b": "unloaded"}
        assert again.usage.cached_tokens > 0, again
        # Idle: a goes after --idle-unload, its process with it; the pinned model stays.
        before = _actor_rss(f"{namespace}-a")
        assert before.get("lineage-model-0", 0) > 0
        deadline = time.monotonic() + 60
        while states()["a"] != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert states() == {"pinned": "loaded", "a": "unloaded", "b": "unloaded"}
        after = _actor_rss(f"{namespace}-a")
        while after and time.monotonic() < deadline:  # the state API catches up
            time.sleep(0.5)
            after = _actor_rss(f"{namespace}-a")
        pinned = _actor_rss(f"{namespace}-pinned")
        print(f"\nRSS of a's actors before the idle unload: {before}; after: {after}")
        print(f"RSS of the pinned model's actors: {pinned}")
        assert after == {} and pinned.get("lineage-model-0", 0) > 0
        assert fleet.members["pinned"].state == "loaded"
    finally:
        client.close()
        engine.stop()
