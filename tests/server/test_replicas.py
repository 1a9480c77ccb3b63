"""Runs tests/server/cluster_replicas.py and tests/server/cluster_fleet.py in one pytest
process of its own, on one two-node cluster (the plugin tests/server/cluster.py).

Its driver joins a two-node `ray.cluster_utils.Cluster`, which cannot share a
process with the session's Ray (tests/conftest.py `ray_session`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ray
def test_replicas_and_a_fleet_on_a_two_node_cluster():
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.server.cluster",
            "tests/server/cluster_replicas.py",
            "tests/server/cluster_fleet.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
