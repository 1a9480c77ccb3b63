"""What a long-running `lineage serve` holds is bounded: its log file and its Ray's GCS
and raylet.

The log file (`--log-file`) rotates at `--log-file-bytes` and keeps two older
files, so a day's run holds at most three times that on disk. The Ray a serve
starts keeps the task events of its last calls, not Ray's 100,000 (each call
of the engine's is a task there), no profile event of any (the driver's own
task would get one per call it makes), and records no metrics unless they are
exported (`--metrics-port`): the engine's own then go nowhere, silently. Its
GCS and raylet run Ray's jemalloc without thread caches, on two arenas, with
its background thread giving free pages back. A cluster the serve joins keeps
its own.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile

import pytest

from engine.config import EngineConfig
from engine.config.server import ServerConfig
from engine.server.running.lifecycle import log_handler
from engine.server.running.serve import (
    PROFILE_EVENTS_PER_TASK,
    RAY_JEMALLOC,
    TASK_EVENTS_IN_GCS,
    WORKER_MALLOC,
    ray_address_warning,
    ray_environment,
    ray_options,
)
from tests.child import run_python


def _config(**server) -> EngineConfig:
    return EngineConfig().with_server(**server)


def _driven(script: str, **given: str):
    """`script` run in a process of its own with no RAY_ or LINEAGE_ variable nor a
    preloaded allocator of this process's, and `given` (tests.child.run_python)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LINEAGE_"))}
    env.pop("LD_PRELOAD", None)
    return run_python(script, env=dict(env, RAY_USAGE_STATS_ENABLED="0", **given), timeout=180)


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
    assert local["task_events_max_num_profile_events_per_task"] == PROFILE_EVENTS_PER_TASK == 0
    assert "_system_config" not in ray_options(_config(address="auto"))


# A driver on the serve's Ray options where Ray's temp dir names a cluster (a dead one, as
# after a `ray start` or a test's Cluster killed before its stop) and RAY_ADDRESS another.
STALE = """
import json, os, ray
from engine.config import EngineConfig
from engine.server.running.serve import ray_options
os.makedirs(os.path.join(os.environ["RAY_TMPDIR"], "ray"))
with open(os.path.join(os.environ["RAY_TMPDIR"], "ray", "ray_current_cluster"), "w") as f:
    f.write("127.0.0.1:9")
ray.init(**ray_options(EngineConfig().with_server(num_cpus=1, ray_namespace="bounds-stale")))
print(json.dumps({"cpus": ray.cluster_resources().get("CPU")}))
ray.shutdown()
"""


@pytest.mark.ray
@pytest.mark.parametrize("given", [{}, {"RAY_ADDRESS": "127.0.0.1:9"}], ids=["file", "env"])
def test_a_local_ray_is_one_of_its_own_whatever_cluster_the_machine_names(given):
    """`lineage serve` without --address starts its own Ray, beside a stale cluster
    address in Ray's temp dir, and beside a RAY_ADDRESS too (Ray reads that first: the
    file alone is its own case) (a ValueError on its settings, or a ConnectionError,
    when it joined what these named)."""
    tmp = tempfile.mkdtemp(prefix="lrt", dir="/tmp")  # short: Ray's socket paths live here
    try:
        _, out = _driven(STALE, RAY_TMPDIR=tmp, **given)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert out == {"cpus": 1.0}


def test_the_ray_address_warning_names_the_flag_that_joins_a_cluster():
    """Where RAY_ADDRESS is set and no address given, the serve says how to join a cluster:
    with a flag `lineage serve` takes."""
    from engine.config.declare import settings_of

    said = ray_address_warning(_config(), {"RAY_ADDRESS": "10.0.0.1:6379"})
    flag = re.search(r"--[a-z-]+", said).group()
    assert flag in {s.flag for s in settings_of(ServerConfig)}, said
    assert ray_address_warning(_config(), {"RAY_ADDRESS": ""}) is None
    assert ray_address_warning(_config(address="auto"), {"RAY_ADDRESS": "10.0.0.1:6379"}) is None


def test_the_log_settings_are_server_settings():
    assert ServerConfig().log_file is None and ServerConfig().log_file_bytes == 64 << 20


def test_a_local_ray_records_metrics_only_when_they_are_exported():
    assert ray_options(_config())["_system_config"]["enable_metrics_collection"] is False
    exported = ray_options(_config(metrics_port=9400))
    assert "enable_metrics_collection" not in exported["_system_config"]
    assert exported["_metrics_export_port"] == 9400


# A driver on the serve's Ray options calling an actor on the engine's actor options (a
# call and a streaming generator, 200 times each); prints what its GCS keeps of the calls'
# task events once the workers have sent them (once a second).
CALLER = """
import json, time
import grpc, ray
from ray._raylet import AuthenticationTokenLoader
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
from engine.config import EngineConfig
from engine.server.running.serve import ACTOR_OPTIONS, ray_options
ray.init(**ray_options(EngineConfig().with_server(num_cpus=1, ray_namespace="bounds-events")))

@ray.remote(num_cpus=0)
class Actor:
    def call(self, i):
        return i

    def stream(self, n):
        for i in range(n):
            yield i

actor = Actor.options(**ACTOR_OPTIONS).remote()
for i in range(200):
    ray.get(actor.call.remote(i))
    for _ in actor.stream.options(num_returns="streaming").remote(4):
        pass
time.sleep(3)
token = AuthenticationTokenLoader.instance().get_token_for_http_header(ignore_auth_mode=True)
with grpc.insecure_channel(ray.get_runtime_context().gcs_address) as channel:
    reply = gcs_service_pb2_grpc.TaskInfoGcsServiceStub(channel).GetTaskEvents(
        gcs_service_pb2.GetTaskEventsRequest(), timeout=10, metadata=tuple(token.items())
    )
events = reply.events_by_task
print(json.dumps({
    "tasks": len(events),
    "profile_events": sum(len(e.profile_events.events) for e in events),
    "dropped": reply.num_profile_task_events_dropped,
}))
ray.shutdown()
"""


@pytest.mark.ray
def test_a_local_rays_gcs_keeps_no_profile_event_of_the_calls_a_driver_makes():
    """Each actor call gives the driver's own task a `submit_task` profile event, whatever
    the actor's options say; Ray's GCS kept the last 1,000 of them per task, a memory that
    filled over a serve's first quarter of an hour."""
    _, kept = _driven(CALLER)
    assert kept["profile_events"] == 0, kept
    assert kept["dropped"] >= 400  # the calls were made and their events dropped


def test_a_local_rays_gcs_and_raylet_get_the_engines_jemalloc_settings_unless_told_others(
    monkeypatch,
):
    for name in ("RAY_JEMALLOC_CONF", "RAY_JEMALLOC_PROFILE", "LD_PRELOAD", *WORKER_MALLOC):
        monkeypatch.delenv(name, raising=False)
    env = ray_environment(_config())
    jemalloc = {"RAY_JEMALLOC_CONF": RAY_JEMALLOC, "RAY_JEMALLOC_PROFILE": "gcs_server,raylet"}
    assert env == WORKER_MALLOC | jemalloc
    assert ray_environment(_config(address="auto")) == {}  # a cluster's own
    # Ray would refuse to start a raylet under a profiler with them ("At most one of ...").
    monkeypatch.setenv("RAY_RAYLET_PERFTOOLS_PROFILER", "1")
    assert ray_environment(_config()) == WORKER_MALLOC
    monkeypatch.delenv("RAY_RAYLET_PERFTOOLS_PROFILER")
    monkeypatch.setenv("RAY_JEMALLOC_CONF", "prof:true")  # someone profiling Ray's heap
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")  # the user's own, kept
    assert ray_environment(_config()) == {"MALLOC_MMAP_THRESHOLD_": "131072"}


# A driver starting a Ray as `lineage serve` does; prints, for its GCS and raylet, the
# MALLOC_CONF they were started with and their threads' names.
ALLOCATOR = """
import json, os
import psutil, ray
from engine.config import EngineConfig
from engine.server.running.serve import ray_environment, ray_options
config = EngineConfig().with_server(num_cpus=1, ray_namespace="bounds-jemalloc")
os.environ.update(ray_environment(config))
ray.init(**ray_options(config))
out = {}
for p in psutil.Process().children(recursive=True):
    name = os.path.basename(p.cmdline()[0])
    if name in ("gcs_server", "raylet"):
        threads = [open(f"/proc/{p.pid}/task/{t.id}/comm").read().strip() for t in p.threads()]
        out[name] = {"conf": p.environ().get("MALLOC_CONF"), "threads": threads}
print(json.dumps(out))
ray.shutdown()
"""


@pytest.mark.ray
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Ray preloads jemalloc on Linux")
def test_a_local_rays_gcs_and_raylet_run_jemalloc_on_the_engines_settings():
    """Their jemalloc took the settings: its background thread runs in each (it gives free
    pages back on a timer, not only when the arena that freed them allocates again)."""
    _, told = _driven(ALLOCATOR)
    assert sorted(told) == ["gcs_server", "raylet"]
    for process in told.values():
        assert process["conf"] == RAY_JEMALLOC
        assert "jemalloc_bg_thd" in process["threads"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Ray preloads jemalloc on Linux")
def test_the_serves_actors_start_on_the_engines_malloc_settings(served):
    """glibc reads them as a process starts: they must be in the actors' own environment."""
    import psutil

    found = {}
    for p in psutil.Process(served.process.pid).children(recursive=True):
        line = " ".join(p.cmdline())
        for role in ("ModelActor", "CacheManagerActor"):
            if line.startswith("ray::") and role in line:
                found[role] = {k: p.environ().get(k) for k in WORKER_MALLOC}
    assert found == {"ModelActor": WORKER_MALLOC, "CacheManagerActor": WORKER_MALLOC}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Ray preloads jemalloc on Linux")
def test_the_serves_own_gcs_and_raylet_run_jemalloc_on_the_engines_settings(served):
    import psutil

    found = {}
    for p in psutil.Process(served.process.pid).children(recursive=True):
        name = os.path.basename(p.cmdline()[0]) if p.cmdline() else ""
        if name in ("gcs_server", "raylet"):
            found[name] = p.environ().get("MALLOC_CONF")
    assert found == {"gcs_server": RAY_JEMALLOC, "raylet": RAY_JEMALLOC}


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
    done, told = _driven(DRIVER)
    assert told["enable_metrics_collection"] is False
    noise = [line for line in done.stderr.splitlines() if "metric" in line.lower()]
    assert noise == []
