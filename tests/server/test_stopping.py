"""Bounded stop steps (engine.server.running.stopping): a call that blocks is left behind, on time.

A blocking call stands in for Ray's without a raylet: an Event nobody sets. The
loop must stay free while it blocks, the wait must end at its timeout, and
the thread must not hold the interpreter's exit (a subprocess exits while
one still blocks).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.server.running.stopping import off_loop, within

ROOT = Path(__file__).resolve().parents[2]


def test_off_loop_returns_the_result_or_raises_the_error():
    async def main():
        assert await off_loop(lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(KeyError):
            await off_loop({}.__getitem__, "x")

    asyncio.run(main())


def test_a_blocked_call_is_left_behind_at_its_timeout_and_the_loop_keeps_running():
    never = threading.Event()
    ticks = []

    async def tick():
        while True:
            ticks.append(1)
            await asyncio.sleep(0.01)

    async def main():
        ticker = asyncio.ensure_future(tick())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(off_loop(never.wait), 0.3)
        ticker.cancel()

    asyncio.run(main())
    assert len(ticks) > 5  # the loop ran while the call blocked
    blocked = [t for t in threading.enumerate() if t.name.startswith("off-loop-")]
    assert blocked and all(t.daemon for t in blocked)
    never.set()  # the thread ends; its result finds the loop closed and is dropped
    for t in blocked:
        t.join(5)
    assert not any(t.is_alive() for t in blocked)


def test_within_says_whether_the_call_returned_in_time():
    assert within(5, lambda: None)
    never = threading.Event()
    assert not within(0.2, never.wait)
    never.set()


def test_a_call_left_blocking_does_not_hold_the_interpreters_exit():
    code = (
        "import threading\n"
        "from engine.server.running.stopping import within\n"
        "assert not within(0.2, threading.Event().wait)\n"
        "print('left')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "left"), done.stderr
