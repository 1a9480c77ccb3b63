"""A full disk for the storage tests, and an engine in process over a real disk tier.

`FullDisk` makes the writer's write call raise ENOSPC while `full` (the write layer,
as on a full disk: the machine's disk is shared and never filled); `short_pauses`
sets the pauses after a full disk a test can wait out (`wait_unpaused`). `loaded`
loads the session's random-weight model once, its entries going to the test's own
directory; `open_engine` opens a LocalEngine over the cache directory as it is now
(a second call is a restart), and `settle` flushes the writer and reports its lost
writes until nothing more is ordered.
"""

from __future__ import annotations

import errno
import time

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.storage import writer
from engine.storage.directory import open_cache_directory
from engine.storage.disk_store import open_disk_store


class FullDisk:
    """writer.write_file raising ENOSPC while `full` (after creating a partial temp file)."""

    def __init__(self, monkeypatch):
        self.full = False
        self.calls = 0
        real = writer.write_file

        def write_file(directory, job):
            self.calls += 1
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(directory, job)

        monkeypatch.setattr(writer, "write_file", write_file)


def short_pauses(store, first: float, most: float) -> None:
    """The writer pauses `first` seconds after a full disk, doubling up to `most`."""
    store.writer.backoff = (first, most)
    store.writer._pause = first


def wait_unpaused(store) -> None:
    deadline = time.monotonic() + 10
    while store.writer.paused:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def loaded(model_cache_dir, random_model_dir, cache_dir) -> tuple[EngineConfig, tuple]:
    """(config, loaded model) of the session's random-weight model, the entries in
    `cache_dir`."""
    from engine.runtime.model.loader import load_model

    config = EngineConfig(
        model=ModelConfig(path=str(random_model_dir), prefill_step_size=128),
        cache=CacheConfig(cache_dir=str(model_cache_dir), ram_budget=1 << 30, guard_min_suffix=256),
    )
    model = load_model(config)
    return config.with_cache(cache_dir=str(cache_dir)), model


def open_engine(config, loaded):
    """An engine over the cache directory as it is now: (engine, store, directory)."""
    from engine.runtime.local import LocalEngine

    fingerprint = loaded[2].fingerprint
    opened = open_cache_directory(config.cache, fingerprint)
    store = open_disk_store(config, fingerprint)
    short_pauses(store, 0.3, 0.6)
    return LocalEngine(config, loaded, store, opened.index), store, opened


def settle(engine, store) -> set[int]:
    """Flush the writer and report to the manager until nothing more is ordered; the ids
    of the files on disk."""
    for _ in range(3):  # a report may order lost writes again: flushed in turn
        assert store.flush(10)
        engine.report_lost()
    return {int(p.stem) for p in store.directory.glob("*.entry")}
