"""What a long-running `lineage serve` holds is bounded: its log file and its Ray's GCS.

The log file (`--log-file`) rotates at `--log-file-bytes` and keeps two older
files, so a day's run holds at most three times that on disk. The Ray a serve
starts keeps the task events of its last calls, not Ray's 100,000 (each call
of the engine's is a task there). A cluster the serve joins keeps its own.
"""

from __future__ import annotations

import logging

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
