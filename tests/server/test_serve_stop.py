"""`lineage serve` stops within 10 s when its process group is signalled, and leaves nothing.

A terminal's Ctrl-C (SIGINT) and `timeout` (SIGTERM) signal the whole process
group: Ray's processes get the signal too, and may die before the engine has
stopped (without a raylet or a GCS, Ray's calls block). A real `lineage serve`
in a session of its own per signal: SIGINT stops the session's shared one (the
`served` fixture, with its bridge and metrics export: after the tests that use it),
SIGTERM one started here. Every process of that session (Ray's GCS, raylet, workers
and agents) must be gone once it has exited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.serve_process import SERVING, start_serve

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


def _stops_within_10s_and_leaves_no_process(serve: subprocess.Popen, log: Path, sig) -> None:
    try:
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


def test_serve_stops_within_10s_of_sigint_to_its_group_and_leaves_no_process(served):
    _stops_within_10s_and_leaves_no_process(served.process, served.log, signal.SIGINT)


def test_serve_stops_within_10s_of_sigterm_to_its_group_and_leaves_no_process(
    model_cache_dir, tmp_path
):
    serve, log = start_serve(model_cache_dir, tmp_path, ready=(SERVING,), new_session=True)
    _stops_within_10s_and_leaves_no_process(serve, log, signal.SIGTERM)
