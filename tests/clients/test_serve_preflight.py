"""`lineage serve` refuses a taken port or a missing model before Ray starts or a model loads.

Each case runs `lineage serve` in a fresh interpreter where importing Ray or
MLX fails: a check that came after either would end in that ImportError's
traceback, not in the one line naming the flag with exit status 2. A port is
taken by a socket this test listens on.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("mlx", "mlx_lm", "ray")


def _serve_without_ray(argv: list[str]) -> subprocess.CompletedProcess:
    """`lineage serve argv` where importing Ray or MLX raises ImportError."""
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {HEAVY!r}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from clients.cli.main import main\n"
        f"sys.exit(main({json.dumps(['serve', *argv])}, env={{}}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def taken_port():
    """A port this test listens on for the case's length."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    "flag, others",
    [
        ("--port", []),
        ("--http-port", ["--port", "0"]),
        ("--metrics-port", ["--port", "0"]),
    ],
)
def test_a_taken_port_is_one_line_naming_it_and_its_flag_with_exit_2(flag, others, taken_port):
    done = _serve_without_ray([*others, flag, str(taken_port)])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"lineage serve: error: {flag} ("), lines
    assert f"127.0.0.1:{taken_port}" in lines[0] and "another process listens there" in lines[0]
    assert done.stdout == ""


def test_one_port_given_to_two_flags_is_refused():
    done = _serve_without_ray(["--port", "0", "--http-port", "47011", "--metrics-port", "47011"])
    assert done.returncode == 2, done.stderr
    assert "--metrics-port" in done.stderr and "also given to --http-port" in done.stderr


def _no_weights(where: Path) -> Path:
    where.mkdir()
    (where / "config.json").write_text("{}")
    return where


@pytest.mark.parametrize(
    "flag, make, says",
    [
        ("--model", lambda tmp: tmp / "missing", "does not exist"),
        ("--model", lambda tmp: tmp, "no config.json in"),
        ("--model", lambda tmp: _no_weights(tmp / "empty"), "no weights in"),
        ("--draft-model", lambda tmp: tmp / "missing", "does not exist"),
    ],
    ids=["missing", "no-config", "no-weights", "draft-missing"],
)
def test_a_model_path_that_holds_no_model_is_one_line_with_exit_2(tmp_path, flag, make, says):
    path = make(tmp_path)
    extra = ["--speculative", "draft"] if flag == "--draft-model" else []
    done = _serve_without_ray(["--port", "0", *extra, flag, str(path)])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"lineage serve: error: {flag} ("), lines
    assert says in lines[0] and str(path) in lines[0]
