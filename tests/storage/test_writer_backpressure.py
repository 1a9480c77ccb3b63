"""Disk writer backpressure: a byte cap on the queue, and a full disk (ENOSPC).

Real files in a temporary directory; a full disk is an OSError(ENOSPC) raised
from the writer's write path. A lost write must leave no file behind, be
reported by `take_lost`, and take with it the files it superseded (the index
forgot them when it ordered the write), while deletes keep running. The last
test drives the real model and cache manager in process (LocalEngine) and
checks that the disk index equals the directory after writes are lost, and
after they resume.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np

from engine.storage import writer
from engine.storage.disk_store import DiskStore
from tests.storage.full_disk import (
    FullDisk,
    loaded,
    open_engine,
    settle,
    short_pauses,
    wait_unpaused,
)
from tests.storage.test_disk_files import _entry, _record


def _files(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_a_full_disk_loses_writes_pauses_them_keeps_deleting_and_resumes(tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch)
    store = DiskStore(tmp_path, "fp")
    short_pauses(store, 1.0, 2.0)
    reported = []
    store.on_report = lambda: reported.append(True)
    entry = _entry("hybrid-float32")
    store.write(entry, _record(1, 30))
    store.write(entry, _record(5, 30))
    assert store.flush(10) and _files(tmp_path) == ["1.entry", "5.entry"]

    disk.full = True
    store.write(entry, replace(_record(2, 30), supersedes=(5,)))  # ENOSPC: writes pause
    store.write(entry, _record(3, 30))  # due during the pause: given up, never tried
    store.delete(1)  # deletes still run: they free space
    assert store.flush(10)
    assert store.take_lost() == [2, 3] and store.take_lost() == []
    assert reported, "on_report was not called"
    assert disk.calls == 3, "the write due during the pause was tried"
    # 5's file was superseded by 2: the index forgot it, so it goes with the lost write.
    assert _files(tmp_path) == []
    stats = store.stats()["writer"]
    assert stats["no_space"] == 2 and stats["failed"] == 0 and stats["files"] == 2

    disk.full = False
    wait_unpaused(store)  # past the pause: writing resumes
    store.write(entry, _record(4, 30))
    assert store.flush(10) and _files(tmp_path) == ["4.entry"]
    assert store.take_lost() == []
    disk.full = True  # full again: the next pause is back at the first step
    store.write(entry, _record(6, 30))
    assert store.flush(10) and store.writer.paused and store.take_lost() == [6]
    store.close(10)


def test_the_queue_holds_at_most_its_byte_cap(tmp_path, monkeypatch):
    gate, started = threading.Event(), threading.Event()
    real = writer.write_file

    def slow_write(directory, job):
        if job.entry_id == 1:
            started.set()
            gate.wait(10)
        return real(directory, job)

    monkeypatch.setattr(writer, "write_file", slow_write)
    entry = _entry("hybrid-float32")
    store = DiskStore(tmp_path / "e", "fp", max_queued_bytes=1)
    store.write(entry, _record(1, 30))  # an empty queue takes any write
    assert started.wait(10)
    store.write(entry, _record(2, 30))  # queued behind 1: the queue is empty again
    store.write(entry, _record(9, 30))
    (tmp_path / "e" / "7.entry").write_bytes(b"old")
    store.write(entry, replace(_record(3, 30), supersedes=(7,)))  # past the cap: refused
    assert store.take_lost() == [9, 3]
    gate.set()
    assert store.flush(10)
    assert _files(tmp_path / "e") == ["1.entry", "2.entry"], "7 superseded by a refused write"
    stats = store.stats()
    assert stats["writer"]["refused"] == 2 and stats["queued_bytes"] == 0
    store.close(10)


def test_a_write_never_queued_is_lost_with_the_files_it_replaces_and_files_report_bytes(
    tmp_path,
):
    entry = _entry("hybrid-float32")
    store = DiskStore(tmp_path, "fp")
    store.write(entry, _record(1, 30))
    assert store.flush(10)
    ((written, nbytes),) = store.take_written()
    assert written == 1 and nbytes == (tmp_path / "1.entry").stat().st_size
    (tmp_path / "7.entry").write_bytes(b"old")
    store.skip(replace(_record(2, 30), supersedes=(7,)))  # the entry was not held
    assert store.flush(10) and store.take_lost() == [2]
    assert _files(tmp_path) == ["1.entry"], "7 left behind (the index forgot it at the order)"
    assert store.stats()["writer"]["skipped"] == 1
    store.close(10)


def test_the_disk_index_stays_true_to_the_directory_when_writes_are_lost(
    model_cache_dir, random_model_dir, tmp_path, monkeypatch
):
    disk = FullDisk(monkeypatch)
    config, model = loaded(model_cache_dir, random_model_dir, tmp_path)
    engine, store, opened = open_engine(config, model)

    def on_disk() -> set[int]:
        return settle(engine, store)

    def indexed() -> set[int]:
        return set(engine.manager.disk_index.files)

    rng = np.random.default_rng(0)
    sessions = [list(rng.integers(20, 3000, 200)) for _ in range(3)]
    try:
        engine.run(sessions[0], max_tokens=2)
        assert on_disk() == indexed() and len(indexed()) == 1
        disk.full = True
        for tokens in sessions[1:]:
            engine.run(tokens, max_tokens=2)
        first = on_disk()
        assert first == indexed(), (first, indexed())
        # (at least 2: a pause that ends mid-window orders them again, lost again)
        assert len(first) == 1 and engine.manager.stats().disk_writes_lost >= 2
        disk.full = False
        wait_unpaused(store)  # past the pause: a new turn's file is written and indexed
        final = engine.run(sessions[1] + [7, 8], max_tokens=2).final
        assert final.restore_kind != "none", "the entry whose file was lost is still in RAM"
        # The new turn absorbed its session's entry; the other lost one, still in RAM, is
        # written again once a write shows the disk takes them.
        after = on_disk()
        assert after == indexed() and len(after) == 3, after
        engine.manager.check_invariants()
    finally:
        store.close(10)
        opened.close()
