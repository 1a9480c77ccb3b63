"""`lineage serve` stops within 10 s when its process group is signalled, and leaves nothing.

A terminal's Ctrl-C (SIGINT) and `timeout` (SIGTERM) signal the whole process
group: Ray's processes get the signal too, and may die before the engine has
stopped (without a raylet or a GCS, Ray's calls block). One real `lineage
serve` in a session of its own per signal; every process of that session
(Ray's GCS, raylet, workers and agents) must be gone once it has exited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.ray,  # starts a Ray of its own, in the served process
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux /proc"),
]
STOP_WITHIN = 10.0  # seconds from the signal to the exit


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def in_session(sid: int) -> dict[int, str]:
    """{pid: command name} of the live (not zombie) processes of session `sid`."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and int(fields[3]) == sid and fields[0] != "Z":
                try:
                    out[int(entry)] = Path(f"/proc/{entry}/comm").read_text().strip()
                except OSError:
                    continue
    return out


def _kill_session(sid: int) -> None:
    for pid in in_session(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_stops_within_10s_of_its_group_signalled_and_leaves_no_process(
    model_cache_dir, tmp_path, sig
):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LINEAGE_"))}
    env.update(PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    command = [sys.executable, "-m", "clients.cli", "serve", "--port", "0"]
    command += ["--cache-dir", str(model_cache_dir), "--ram-budget", "1G"]
    log = tmp_path / "serve.out"
    with log.open("w") as out:
        serve = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,  # its own session and process group, as under `timeout`
        )
    try:
        deadline = time.monotonic() + 300
        while "lineage: serving" not in log.read_text():
            assert serve.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        started = in_session(serve.pid)
        assert any("raylet" in name for name in started.values()), started  # Ray runs in it

        os.killpg(serve.pid, sig)
        try:
            code = serve.wait(STOP_WITHIN)
        except subprocess.TimeoutExpired:
            tail = log.read_text()[-3000:]
            pytest.fail(f"still running {STOP_WITHIN} s after {sig.name}:\n{tail}")
        assert code == 0, log.read_text()[-3000:]
        # Ray's processes end with it (the last ones within moments of its exit)
        end = time.monotonic() + 10
        while in_session(serve.pid) and time.monotonic() < end:
            time.sleep(0.2)
        assert in_session(serve.pid) == {}, log.read_text()[-3000:]
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)
        _kill_session(serve.pid)
