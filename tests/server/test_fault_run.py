"""`lineage bench faults` end to end, a deep test: LINEAGE_DEEP_TESTS=1 runs it (minutes).

It starts its own Ray and engines, so it runs in a process of its own, like
tests/server/test_replicas.py's cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deep import deep

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not deep(), reason="a deep test: LINEAGE_DEEP_TESTS=1")
def test_the_fault_run_survives_every_fault_with_no_wrong_reply_and_nothing_leaked(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    out = tmp_path / "faults.json"
    done = subprocess.run(
        [sys.executable, "-m", "clients.cli", "bench", "faults", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["faults_survived"] == 4 and figures["wrong_replies"] == 0
    assert figures["leaked_bytes"] == 0 and figures["orphaned_files"] == 0
    assert figures["compared_replies"] > 0
