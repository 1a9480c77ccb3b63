"""A Python script run in a process of its own, for tests that measure what a process holds
(tracemalloc or the resident set beside the session's Ray and MLX threads is unreliable, and
tracing there has crashed the test process) or start a Ray of their own.

It knows subprocesses and JSON; nothing of the engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_python(script: str, *args: str, env: dict | None = None, timeout: float = 300):
    """Run `script` with `args` in this checkout (cwd and PYTHONPATH), in `env` (default:
    this process's): (the finished process, the JSON of its last line of output). It must
    exit 0."""
    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(done.stdout.strip().splitlines()[-1])
