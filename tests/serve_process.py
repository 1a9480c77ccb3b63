"""Real `lineage serve` processes, for the tests that need the command itself (its Ray's
ports, its metrics export, how it stops): started with the embedded model, stopped with
SIGINT as a user would.

`start_serve` starts one for a test of its own. `SharedServe` (the session's `served`
fixture, tests/conftest.py) keeps one `--http-port --metrics-port` process for the tests
that only need a running one (the coding agents, Prometheus, its sockets), in a session
of its own so that a test may signal its whole process group; once a test has stopped
it, the next one to ask starts another.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVING, BRIDGE = "lineage: serving", "OpenAI-compatible bridge on"  # the lines it prints


def free_port() -> int:
    import socket

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


def start_serve(
    cache_dir,
    workdir: Path,
    *flags: str,
    ready: tuple[str, ...],
    new_session: bool = False,
    env: dict | None = None,
) -> tuple[subprocess.Popen, Path]:
    """`lineage serve --port 0 --cache-dir CACHE_DIR --ram-budget 1G FLAGS` (with `env`
    beside the test's environment, less its RAY_ and LINEAGE_ variables) and its log,
    once the log shows every line of `ready`; killed if it exits or takes over 300 s first."""
    given = env or {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LINEAGE_"))}
    env.update(PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", **given)
    command = [sys.executable, "-m", "clients.cli", "serve", "--port", "0"]
    command += ["--cache-dir", str(cache_dir), "--ram-budget", "1G", *flags]
    log = Path(workdir) / "serve.out"
    with log.open("w") as out:
        serve = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=new_session,  # its own process group, as under `timeout`
        )
    try:
        deadline = time.monotonic() + 300
        while not all(line in log.read_text() for line in ready):
            assert serve.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    except BaseException:
        serve.kill()
        serve.wait(30)
        raise
    return serve, log


@dataclass
class Served:
    """A running `lineage serve --http-port HTTP --metrics-port METRICS`, serving the
    coding agents' model names (`claude-*`, `gpt-*`) too."""

    process: subprocess.Popen
    log: Path
    http: int
    metrics: int


class SharedServe:
    """One `lineage serve` for the tests that share it: `current()` is the running one,
    started anew if a test stopped the last."""

    def __init__(self, cache_dir: Path, workdir: Path):
        self.cache_dir, self.workdir = cache_dir, workdir
        self.served: Served | None = None

    def current(self) -> Served:
        if self.served is None or self.served.process.poll() is not None:
            metrics, http = free_port(), free_port()
            flags = ("--http-port", str(http), "--metrics-port", str(metrics))
            flags += ("--model-alias", "claude-*", "--model-alias", "gpt-*")  # the agents' names
            serve, log = start_serve(
                self.cache_dir, self.workdir, *flags, ready=(BRIDGE, SERVING), new_session=True
            )
            self.served = Served(serve, log, http, metrics)
        return self.served

    def close(self) -> None:
        if self.served is not None and self.served.process.poll() is None:
            stop(self.served.process)
