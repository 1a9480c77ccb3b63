"""What a long-running `lineage serve` holds is bounded: its log file and its Ray's GCS
and raylet.

The log file (`--log-file`) rotates at `--log-file-bytes` and keeps two older
files, so a day's run holds at most three times that on disk. The Ray a serve
starts keeps the task events of its last calls, not Ray's 100,000 (each call
of the engine's is a task there), and records no metrics unless they are
exported (`--metrics-port`): the engine's own then go nowhere, silently. A
cluster the serve joins keeps its own.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.config.server import ServerConfig
from engine.server.running.lifecycle import log_handler
from engine.server.running.serve import TASK_EVENTS_IN_GCS, ray_options


def _config(**server) -> EngineConfig:
    return EngineConfig().with_server(**server)


def test_the_log_file_rotates_at_its_size_and_keeps_two_older_files(tmp_path):
    path = tmp_path / "serve.log"
    handler = log_handler(_config(log_file=str(path), log_file_bytes=4096))
    logger = logging.getLogger("lineage.test-serve-bounds")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for i in range(2000):
            logger.warning("line %d of a day's traffic", i)
    finally:
        logger.removeHandler(handler)
        handler.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["serve.log", "serve.log.1", "serve.log.2"]
    assert all((tmp_path / f).stat().st_size <= 4096 for f in files)
    assert "line 1999 " in path.read_text()


def test_without_a_log_file_the_log_goes_to_stderr():
    handler = log_handler(_config())
    assert type(handler) is logging.StreamHandler


def test_a_local_ray_keeps_the_events_of_its_last_calls_a_joined_one_its_own():
    local = ray_options(_config())["_system_config"]
    assert local["task_events_max_num_task_in_gcs"] == TASK_EVENTS_IN_GCS <= 10_000
    assert "_system_config" not in ray_options(_config(address="auto"))


def test_the_log_settings_are_server_settings():
    assert ServerConfig().log_file is None and ServerConfig().log_file_bytes == 64 << 20


def test_a_local_ray_records_metrics_only_when_they_are_exported():
    assert ray_options(_config())["_system_config"]["enable_metrics_collection"] is False
    exported = ray_options(_config(metrics_port=9400))
    assert "enable_metrics_collection" not in exported["_system_config"]
    assert exported["_metrics_export_port"] == 9400


# A driver on the serve's Ray options, recording the engine's metrics with warnings as
# errors; prints the system config its GCS was started with (and hands its raylet).
DRIVER = """
import base64, sys, warnings
warnings.simplefilter("error")
import psutil, ray
from engine.config import EngineConfig
from engine.server.observe.metrics import EngineMetrics
from engine.server.running.serve import ray_options
ray.init(**ray_options(EngineConfig().with_server(num_cpus=1, ray_namespace="bounds-test")))
m = EngineMetrics("bounds-test", "m")
for i in range(200):
    m.error("INVALID_ARGUMENT")
    m.ttft.observe(i, m._tags())
    m.entries.set(i, m._tags())
for p in psutil.Process().children(recursive=True):
    for arg in p.cmdline():
        if "gcs_server" in p.cmdline()[0] and arg.startswith("--config_list="):
            print(base64.b64decode(arg.split("=", 1)[1]).decode())
ray.shutdown()
"""


@pytest.mark.ray
def test_the_engines_metrics_are_recorded_silently_on_a_ray_that_collects_none():
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LINEAGE_"))}
    env.update(PYTHONPATH=str(root), RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run(
        [sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    told = json.loads(done.stdout.strip().splitlines()[-1])
    assert told["enable_metrics_collection"] is False
    noise = [line for line in done.stderr.splitlines() if "metric" in line.lower()]
    assert noise == []
