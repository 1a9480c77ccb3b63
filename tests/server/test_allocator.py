"""The front end's malloc: free pages go back to the system, arenas are capped (glibc)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from engine.server.running import allocator

pytestmark = pytest.mark.skipif(allocator.glibc() is None, reason="malloc is not glibc's")

# Four threads each fill their arena with 2 KiB blocks (past pymalloc, so malloc's own), keep
# one in 32 and free the rest: most pages are free and scattered, none at an arena's top.
FRAGMENT = """
import json, sys, threading
from engine.server.running import allocator
if sys.argv[1] == "capped":
    allocator.limit_arenas(1)
kept = []
def fill():
    blocks = [bytes(2048) + bytes([i % 256]) for i in range(30_000)]
    kept.extend(blocks[::32])
threads = [threading.Thread(target=fill) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
allocator.glibc().malloc_stats()  # one "Arena N:" block per arena, on stderr
before = allocator.resident_bytes()
trimmer = allocator.Trimmer(interval=60)
gone = trimmer.trim()
print(json.dumps({"before": before, "gone": gone, "trims": trimmer.trims,
                  "returned": trimmer.returned}))
"""


def run_child(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", FRAGMENT, mode], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) | {"arenas": out.stderr.count("Arena ")}


def test_a_trim_gives_back_the_pages_that_freed_blocks_left_in_every_arena():
    figures = run_child("plain")
    # 4 x 30,000 x 2 KiB = 234 MiB allocated, 7 MiB kept: most of the rest was resident
    # until the trim (glibc returns only an arena's top by itself)
    assert figures["gone"] > 64 << 20, figures
    assert figures["trims"] == 1 and figures["returned"] == figures["gone"]


def test_the_trimmer_trims_on_its_interval_and_stops():
    trimmer = allocator.Trimmer(interval=0.05)
    assert trimmer.start()
    deadline = time.monotonic() + 10
    while trimmer.trims < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    trimmer.stop()
    assert trimmer.trims >= 2
    stopped = trimmer.trims
    time.sleep(0.2)
    assert trimmer.trims == stopped


def test_no_interval_no_thread():
    assert not allocator.Trimmer(interval=0).start()


def test_arenas_are_capped_before_threads_start():
    assert run_child("plain")["arenas"] >= 4  # a thread's own arena each, and the main one
    assert run_child("capped")["arenas"] == 1
    assert not allocator.limit_arenas(0)  # glibc's own rule: nothing to set
