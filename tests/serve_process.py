"""One real `lineage serve` in a process of its own, for the tests that need the command
itself (its Ray's ports, its metrics export): started with the embedded model in the
session's cache directory, stopped with SIGINT as a user would."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen, sig=signal.SIGINT) -> None:
    process.send_signal(sig)
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


@contextlib.contextmanager
def lineage_serve(cache_dir, workdir: Path, *flags: str, patience: float = 300):
    """`lineage serve --port 0 --cache-dir CACHE_DIR --ram-budget 1G FLAGS` (with an
    --http-port among them), once its bridge is up; the process is stopped on exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LINEAGE_"))}
    env.update(PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    command = [sys.executable, "-m", "clients.cli", "serve", "--port", "0"]
    command += ["--cache-dir", str(cache_dir), "--ram-budget", "1G", *flags]
    log = Path(workdir) / "serve.out"
    with log.open("w+") as out:
        serve = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=workdir
        )
        try:
            deadline = time.monotonic() + patience
            while "OpenAI-compatible bridge on" not in log.read_text():
                assert serve.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            yield serve
        finally:
            stop(serve)
