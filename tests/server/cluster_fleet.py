"""Two models placed on the two nodes of a `ray.cluster_utils.Cluster` on this machine.

Each node has {"mlx": 1} and a resource of its own (`node_a`, `node_b`); each model
asks for one of them (`--model NAME=PATH,resource=node_a`), so its actors run on that
node, and both answer through the one front end. The cluster is tests/server/cluster.py's, a
plugin of the pytest process of its own that tests/server/test_replicas.py runs (after
tests/server/cluster_replicas.py, on the same cluster): the cluster's driver cannot share
a process with the session's Ray.
"""

from __future__ import annotations

import dataclasses

from clients.client import Client
from engine.config import FleetConfig, ModelSpec, parse_bytes
from tests.engines import make_config


def test_each_model_runs_on_the_node_with_its_resource(cluster, tmp_path_factory):
    import ray

    from engine.runtime.model.tiny_models import write_model_dir
    from engine.server.running.background import BackgroundEngine

    qwen = write_model_dir("qwen3_next", tmp_path_factory.mktemp("random-qwen3_next"))
    kimi = write_model_dir("kimi_linear", tmp_path_factory.mktemp("random-kimi_linear"))
    models = (
        ModelSpec("big", str(qwen), resources=(("node_a", 1.0),)),
        ModelSpec("small", str(kimi), resources=(("node_b", 1.0),)),
    )
    config = make_config(tmp_path_factory.mktemp("cluster-fleet"))
    config = dataclasses.replace(config, fleet=FleetConfig(models=models))
    config = config.with_cache(ram_budget=parse_bytes("256M"))
    with BackgroundEngine(config) as engine, Client(engine.address, timeout=120) as client:
        members = engine.engine.fleet.members
        nodes = {
            name: set(ray.get([m.node.remote() for m in members[name].group.replicas]))
            for name in ("big", "small")
        }
        alive = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        for name, resource in (("big", "node_a"), ("small", "node_b")):
            holder = {node for node, resources in alive.items() if resource in resources}
            assert nodes[name] == holder, (name, nodes, alive)
        assert nodes["big"] != nodes["small"]
        for model in ("big", "small"):
            result = client.generate([{"role": "user", "content": "Hi"}], max_tokens=3, model=model)
            assert result.usage.completion_tokens > 0
