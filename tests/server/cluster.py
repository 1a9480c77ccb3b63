"""A pytest plugin (`-p tests.server.cluster`): the session's two-node Ray cluster
(ray.cluster_utils.Cluster) on this machine, shared by tests/server/cluster_replicas.py
and tests/server/cluster_fleet.py, which tests/server/test_replicas.py runs in one pytest
process of its own (the cluster's driver cannot share a process with the session's Ray).

Each node has {"mlx": 1} and 1 CPU, so `--replicas auto` puts one replica on each, and a
resource of its own (`node_a` on the head, `node_b`), which a fleet's model may ask for.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"mlx": 1, "node_a": 1},
            "include_dashboard": False,
        },
    )
    c.add_node(num_cpus=1, resources={"mlx": 1, "node_b": 1})
    ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    yield c
    ray.shutdown()
    c.shutdown()
