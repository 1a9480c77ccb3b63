"""The disk reader's threads: an idle-priority read the CPU is not left for finishes on
the late thread, bytes and checks unchanged; a load on the caller's thread leaves that
thread's priority alone (the model loop loads on its own thread for a handover).

Real MLX arrays and real files in a temporary directory; no model, no Ray.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.storage import file_format
from engine.storage.disk_store import DiskStore
from tests.storage.test_disk_files import _assert_same, _damage, _entry, _record, _restored

LINUX = sys.platform.startswith("linux")
N = 600


def _stored(tmp_path, **late) -> tuple:
    store = DiskStore(tmp_path, "fp", **late)
    entry = _entry("hybrid-float32", N)
    store.write(entry, _record(9, N))
    assert store.flush(10)
    return store, entry


def _policy_and_nice(executor) -> tuple[int, int]:
    def look():
        tid = threading.get_native_id()
        return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)

    return executor.submit(look).result()


def test_a_starved_read_finishes_on_the_late_thread_with_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(file_format, "READ_CHUNK", 4096)  # many chunks: the crc spans them
    # Every read counts as starved: its first step runs on the reader, the rest late.
    store, entry = _stored(tmp_path, late_after=0.0, late_rate=float("inf"))
    fresh = DiskStore(tmp_path, "fp", late_after=0.0, late_rate=float("inf"))  # nothing queued
    reader = ThreadPoolExecutor(1, thread_name_prefix="disk-reader")  # read() idles its thread
    loaded = fresh.finish(reader.submit(fresh.read, 9).result())
    assert fresh.late_loads == 1 and fresh.stats()["late_loads"] == 1
    _assert_same(_restored(entry, N), _restored(loaded, N))
    if LINUX:
        assert _policy_and_nice(reader)[0] == os.SCHED_IDLE
        policy, nice = _policy_and_nice(fresh._late)
        assert policy == os.SCHED_OTHER and nice >= 10, "niced, never idle"
    fresh.close(10)

    _damage("body-bit-flip", tmp_path / "9.entry")  # found by the late thread's crc
    damaged = DiskStore(tmp_path, "fp", late_after=0.0, late_rate=float("inf"))
    assert damaged.finish(reader.submit(damaged.read, 9).result()) is None
    assert damaged.late_loads == 1 and damaged.load_failures == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["9.damaged"]
    for s in (store, damaged):
        s.close(10)
    reader.shutdown()


@pytest.mark.skipif(not LINUX, reason="per-thread scheduling is Linux's")
def test_a_load_on_the_callers_thread_keeps_its_priority(tmp_path):
    store, entry = _stored(tmp_path)
    fresh = DiskStore(tmp_path, "fp")  # nothing queued: the load reads the file
    caller = ThreadPoolExecutor(1, thread_name_prefix="model-loop")
    before = _policy_and_nice(caller)
    loaded = caller.submit(fresh.load, 9).result()
    _assert_same(_restored(entry, N), _restored(loaded, N))
    assert _policy_and_nice(caller) == before and before[0] == os.SCHED_OTHER
    for s in (store, fresh):
        s.close(10)
    caller.shutdown()
