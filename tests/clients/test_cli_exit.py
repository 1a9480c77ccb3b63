"""`lineage`'s one way out: a Ray the command started and left up is shut down there.

In a fresh interpreter with a stand-in `ray` module (no Ray starts), so that
the check neither needs nor touches the test session's Ray.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, types
state = {{"up": {up_before}, "calls": []}}
ray = types.ModuleType("ray")
ray.is_initialized = lambda: state["up"]
def shutdown():
    state["calls"].append("shutdown")
    state["up"] = False
ray.shutdown = shutdown
sys.modules["ray"] = ray
from clients.cli import main as m

class Starts:
    HELP = "starts a Ray and leaves it up"
    def add_arguments(p):
        pass
    def run(args):
        state["up"] = True
        return 0

m.COMMANDS["starts"] = Starts
code = m.main(["starts"], env={{}})
print(code, state["calls"])
"""


@pytest.mark.parametrize(
    "up_before, calls", [(False, "['shutdown']"), (True, "[]")], ids=["started", "joined"]
)
def test_a_ray_the_command_started_is_shut_down_on_the_way_out(up_before, calls):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(up_before=up_before)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"0 {calls}"  # one up before the command is left alone
