"""The disk reader's threads: an idle-priority read the CPU is not left for is read on
the late thread instead, bytes and checks unchanged; a load on the caller's thread leaves that
thread's priority alone (the model loop loads on its own thread for a handover).

Real MLX arrays and real files in a temporary directory; no model, no Ray.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.storage import disk_store, file_format
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


def _paced(monkeypatch, seconds: float, first_at_once: bool = False) -> None:
    """The reader thread's steps take `seconds` each (as when every core is busy); with
    `first_at_once` its first step's bytes are done before the first pause."""
    real = disk_store.read_steps

    def steps(*args):
        inner = real(*args)
        if not threading.current_thread().name.startswith("disk-reader_"):
            return (yield from inner)
        try:
            if first_at_once:
                yield next(inner)
            while True:
                time.sleep(seconds)
                yield next(inner)
        except StopIteration as stop:
            return stop.value

    monkeypatch.setattr(disk_store, "read_steps", steps)


def _starved(monkeypatch) -> None:
    """The reader thread's steps take 0.2 s each, as when every core is busy."""
    _paced(monkeypatch, 0.2)


def test_a_starved_read_is_read_on_the_late_thread_with_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(file_format, "READ_CHUNK", 4096)  # many chunks: the crc spans them
    _starved(monkeypatch)
    late = dict(late_after=0.05, late_rate=1e12)
    store, entry = _stored(tmp_path, **late)
    fresh = DiskStore(tmp_path, "fp", **late)  # nothing queued: the read reads the file
    t0 = time.perf_counter()
    loaded = fresh.finish(fresh.start_read(9).result())
    assert fresh.late_loads == 1 and fresh.stats()["late_loads"] == 1
    assert time.perf_counter() - t0 < 5, "the reader's starved steps were waited for"
    _assert_same(_restored(entry, N), _restored(loaded, N))
    if LINUX:
        assert _policy_and_nice(fresh._reader)[0] == os.SCHED_IDLE
        policy, nice = _policy_and_nice(fresh._late)
        assert policy == os.SCHED_OTHER and nice >= 10, "niced, never idle"
    fresh.close(10)

    _damage("body-bit-flip", tmp_path / "9.entry")  # found by the late thread's crc
    damaged = DiskStore(tmp_path, "fp", **late)
    assert damaged.finish(damaged.start_read(9).result()) is None
    assert damaged.late_loads == 1 and damaged.load_failures == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["9.damaged"]
    for s in (store, damaged):
        s.close(10)


def test_a_read_the_reader_never_starts_is_read_on_the_late_thread(tmp_path):
    """The watch starts with the read, not on the reader: a reader that gets no CPU at
    all (here: busy with something else) cannot keep a load from being served."""
    store, entry = _stored(tmp_path, late_after=0.05, late_rate=1e12)
    fresh = DiskStore(tmp_path, "fp", late_after=0.05, late_rate=1e12)
    fresh.start_read(9).result()  # the reader thread exists now
    gate = threading.Event()
    fresh._reader.submit(gate.wait)  # and is held
    loaded = fresh.finish(fresh.start_read(9).result(timeout=10))
    gate.set()
    assert fresh.late_loads >= 1  # this one (the first, too, if it fell behind)
    _assert_same(_restored(entry, N), _restored(loaded, N))
    for s in (store, fresh):
        s.close(10)


def test_a_read_that_keeps_its_rate_stays_on_the_reader(tmp_path, monkeypatch):
    # A slow reader (50 ms a step) that keeps over 1 B/s: the watch, waking every 20 ms,
    # compares many times and leaves it on the reader.
    store, entry = _stored(tmp_path, late_after=30.0)
    _paced(monkeypatch, 0.05, first_at_once=True)
    fresh = DiskStore(tmp_path, "fp", late_after=0.02, late_rate=1.0)
    loaded = fresh.finish(fresh.start_read(9).result())
    assert fresh.late_loads == 0
    _assert_same(_restored(entry, N), _restored(loaded, N))
    for s in (store, fresh):
        s.close(10)


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
