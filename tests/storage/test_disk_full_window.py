"""A disk full for a window, under real MLX and a real disk tier: writes lost, then written.

The random-weight model runs in process (LocalEngine) over a real DiskStore in a
temporary directory; the disk is full while the writer's write call raises
ENOSPC (the write layer, as on a full disk: the machine's disk is shared and
never filled). After the window a new turn's file is written, which shows the
disk takes writes again: the entries whose writes were lost and that are still
in RAM are written then too. A restarted engine (a new store and index over the
same directory) restores every conversation from its file.
"""

from __future__ import annotations

import time

import numpy as np

from tests.storage.full_disk import FullDisk, loaded, open_engine, settle, wait_unpaused


def test_after_a_full_disk_new_and_lost_entries_are_written_and_restored_after_a_restart(
    model_cache_dir, random_model_dir, tmp_path, monkeypatch
):
    disk = FullDisk(monkeypatch)
    config, model = loaded(model_cache_dir, random_model_dir, tmp_path)
    rng = np.random.default_rng(1)
    sessions = [list(rng.integers(20, 3000, 200)) for _ in range(4)]

    engine, store, opened = open_engine(config, model)
    try:
        engine.run(sessions[0], max_tokens=2)
        assert len(settle(engine, store)) == 1
        disk.full = True  # the window: both writes are lost, their entries stay in RAM
        for tokens in sessions[1:3]:
            engine.run(tokens, max_tokens=2)
        assert len(settle(engine, store)) == 1
        # Each attempt counts: a pause that ends while the disk is still full orders the
        # lost entries again, and they are lost again.
        assert engine.manager.stats().disk_writes_lost >= 2
        assert store.stats()["writer"]["no_space"] >= 2
        disk.full = False
        wait_unpaused(store)
        engine.run(sessions[3], max_tokens=2)  # the disk has room: a new entry's file
        files = settle(engine, store)
        assert files == set(engine.manager.disk_index.files)
        assert len(files) == 4, f"only {sorted(files)} on disk: the lost entries not rewritten"
        # The budget counts each file at its bytes on disk.
        assert engine.manager.disk_index.nbytes == sum(
            p.stat().st_size for p in store.directory.glob("*.entry")
        )
        engine.manager.check_invariants()
    finally:
        store.close(10)
        opened.close()

    engine, store, opened = open_engine(config, model)  # a restart: the index from the files
    try:
        for tokens in sessions:
            turn = engine.run(tokens + [7, 8], max_tokens=2)
            assert turn.plan.load_from_disk, "not restored from a file after the restart"
            assert turn.final.cached_tokens >= len(tokens) - 16, turn.final.cached_tokens
    finally:
        store.close(10)
        opened.close()


def test_an_idle_engine_writes_its_lost_entries_once_the_pause_after_a_full_disk_ends(
    model_cache_dir, random_model_dir, tmp_path, monkeypatch
):
    disk = FullDisk(monkeypatch)
    config, model = loaded(model_cache_dir, random_model_dir, tmp_path)
    rng = np.random.default_rng(2)
    sessions = [list(rng.integers(20, 3000, 200)) for _ in range(2)]
    engine, store, opened = open_engine(config, model)
    try:
        disk.full = True
        for tokens in sessions:
            engine.run(tokens, max_tokens=2)
        assert store.flush(10) and not settle(engine, store)
        disk.full = False  # the disk has room; no request comes
        wait_unpaused(store)
        deadline = time.monotonic() + 10
        while len(settle(engine, store)) < 2:
            assert time.monotonic() < deadline, "the lost entries were never written"
            time.sleep(0.1)
        assert settle(engine, store) == set(engine.manager.disk_index.files)
        engine.manager.check_invariants()
    finally:
        store.close(10)
        opened.close()
