"""The token ids an entry carries, at every way into a RAM tier: a file, a queued write, a
handover. Each refuses an entry computed on other tokens than the request's. And the
order a RAM tier hands its Orders' file operations to the writer.

Real MLX arrays and real files in a temporary directory; no model, no Ray.
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import replace

import numpy as np
import pytest

from engine.cache.messages import RestorePlan
from engine.runtime.tier.ram import RamTier
from engine.storage import writer
from engine.storage.disk_store import DiskStore
from engine.storage.handover import from_portable, to_portable
from tests.storage.test_disk_files import _entry, _record

N = 40


def _with_tokens(entry_id: int):
    """An entry and its record, the entry carrying the record's token ids."""
    record = _record(entry_id, N)
    return replace(_entry("hybrid-float32", N), tokens=record.tokens), record


def _plan(entry_id: int) -> RestorePlan:
    return RestorePlan("r", entry_id, N, "entry", load_from_disk=True)


def test_a_file_loads_with_its_tokens_and_a_restore_checks_them(tmp_path):
    store = DiskStore(tmp_path, "fp")
    entry, record = _with_tokens(9)
    store.write(entry, record)
    assert store.flush(10)
    tier = RamTier(True, store)
    assert tier.prepare(_plan(9), "ns", record.tokens)
    assert np.array_equal(tier.entries[9].tokens, record.tokens)
    assert tier.matches(9, record.tokens[:10]) and not tier.matches(9, record.tokens[1:11])
    assert (tier.token_checks, tier.token_mismatches) == (3, 1)  # the load's, then two
    store.close(10)


def test_a_queued_write_is_checked_like_a_file(tmp_path, monkeypatch):
    never = threading.Event()
    monkeypatch.setattr(writer, "write_file", lambda directory, job: never.wait())
    store = DiskStore(tmp_path, "fp")
    entry, record = _with_tokens(9)
    store.write(entry, record)  # held in the writer's queue: a load reads it there
    assert store.load(9, "other", record.tokens) is None, "another namespace"
    assert store.load(9, "ns", record.tokens + 1) is None, "other tokens"
    loaded = store.load(9, "ns", record.tokens[:20])
    assert loaded is not None and np.array_equal(loaded.tokens, record.tokens)
    never.set()
    store.close(10)


def test_a_write_of_rows_computed_on_other_tokens_is_refused(tmp_path):
    store = DiskStore(tmp_path, "fp")
    entry, record = _with_tokens(9)
    with pytest.raises(ValueError, match="other tokens"):
        store.write(entry, replace(record, tokens=record.tokens + 1))
    store.close(10)


def test_a_handed_over_entry_carries_its_tokens():
    entry, record = _with_tokens(9)
    back = from_portable(pickle.loads(pickle.dumps(to_portable(entry))))
    assert np.array_equal(back.tokens, record.tokens)
    tier = RamTier(True)
    assert tier.matches(back, record.tokens[:N])
    assert not tier.matches(back, record.tokens[:N] * 2)
    assert tier.token_mismatches == 1


def test_evicted_files_go_before_new_files_are_written(tmp_path, monkeypatch):
    """One Orders that evicts a file to make room for a new one: the writer, which works in
    order, deletes first, so the disk never holds both (the budget holds the files after)."""
    from engine.cache.messages import Orders

    done = []
    real_write, real_delete = writer.write_file, writer.delete_files
    monkeypatch.setattr(
        writer,
        "write_file",
        lambda d, job: done.append(("write", job.entry_id)) or real_write(d, job),
    )
    monkeypatch.setattr(
        writer, "delete_files", lambda d, i: done.append(("delete", i)) or real_delete(d, i)
    )
    store = DiskStore(tmp_path, "fp")
    old, old_record = _with_tokens(9)
    store.write(old, old_record)
    assert store.flush(10)
    tier = RamTier(True, store)
    new, record = _with_tokens(10)
    tier.put(10, new)
    tier.apply(Orders(write=(10,), records=(record,), delete_files=(9,)))
    assert store.flush(10)
    assert done == [("write", 9), ("delete", 9), ("write", 10)]
    store.close(10)
