"""The disk tier's files: round trips of every stored form, damage, the writer, a crash.

Real MLX arrays and real files in a temporary directory; no model, no Ray.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

from engine.cache.messages import EntryRecord
from engine.runtime import layer_caches
from engine.runtime.tier.ram import StoredEntry
from engine.storage import file_format, writer
from engine.storage.codec import read_entry as load_entry
from engine.storage.codec import to_write_job as capture
from engine.storage.directory import open_cache_directory, scan_directory
from engine.storage.disk_store import DiskStore

ROOT = Path(__file__).resolve().parents[2]


def _rand(*shape, seed=0, dtype=mx.float32):
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(dtype)


def _kv(rows, dtype=mx.float32, seed=0, step=7):
    cache = KVCache()
    for i, start in enumerate(range(0, rows, step)):  # several writes: spare capacity
        n = min(step, rows - start)
        cache.update_and_fetch(
            _rand(1, 2, n, 64, seed=seed + i, dtype=dtype),
            _rand(1, 2, n, 64, seed=seed + 50 + i, dtype=dtype),
        )
    return cache


def _arrays(seed=0, dtype=mx.float32):
    cache = ArraysCache(2)
    cache.cache = [_rand(1, 3, 8, seed=seed, dtype=dtype), _rand(1, 2, 4, 4, seed=seed + 1)]
    return cache


def _rotating(rows):
    cache = RotatingKVCache(max_size=8)
    cache.update_and_fetch(_rand(1, 2, rows, 16, seed=3), _rand(1, 2, rows, 16, seed=4))
    return cache


LAYOUTS = {
    "hybrid-float32": lambda n: [_kv(n), _arrays(), _kv(n, seed=9), _arrays(seed=5)],
    "bfloat16": lambda n: [_kv(n, mx.bfloat16), _arrays(dtype=mx.bfloat16)],
    "quantized-kv": lambda n: [_kv(n).to_quantized(group_size=64, bits=4), _arrays()],
    "cache-list": lambda n: [CacheList(_kv(n), _arrays()), _kv(n, seed=2)],
    "sliding-window": lambda n: [_rotating(n), _kv(n)],
}


def _entry(layout: str, n: int = 30) -> StoredEntry:
    caches = LAYOUTS[layout](n)
    layers, state = layer_caches.store_entry(caches)
    return StoredEntry(layers, n, {n: state})


def _record(entry_id: int, n: int, role="conversation", checkpoints=()) -> EntryRecord:
    toks = np.arange(entry_id * 1000, entry_id * 1000 + n, dtype=np.int32)
    return EntryRecord(entry_id, "ns", role, toks, n, tuple(checkpoints), 1, 1)


def _restored(entry: StoredEntry, n: int) -> list:
    out = []
    for cache in layer_caches.restore(entry.layers, entry.states[n], n):
        parts = cache.caches if isinstance(cache, CacheList) else [cache]
        for part in parts:
            out += [(type(part).__name__, getattr(part, "offset", None))]
            out += [a for _, a in tree_flatten(part.state)]
    return out


def _assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, mx.array):
            assert (x.dtype, x.shape) == (y.dtype, y.shape)
            assert mx.array_equal(x, y).item()
        else:
            assert x == y


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_written_entry_loads_back_bit_identical(tmp_path, layout):
    entry = _entry(layout)
    writer.write_file(tmp_path, capture(entry, _record(7, 30), "fp"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["7.entry"]
    header = file_format.read_header(tmp_path / "7.entry")
    assert (header.entry_id, header.length, header.fingerprint) == (7, 30, "fp")
    loaded, _ = load_entry(tmp_path / "7.entry", "fp", 7)
    _assert_same(_restored(entry, 30), _restored(loaded, 30))


def test_an_anchor_sharing_a_longer_entry_writes_its_own_rows_only(tmp_path):
    caches = LAYOUTS["hybrid-float32"](40)
    layers, end = layer_caches.store_entry(caches)
    at_12 = layer_caches.snapshot_state_single(caches)  # stands in for the state at 12
    anchor = StoredEntry(layers, 12, {12: layer_caches.StateSnapshot(at_12.layers, 12)})
    conversation = StoredEntry(layers, 40, {40: end})
    writer.write_file(tmp_path, capture(anchor, _record(3, 12, "anchor"), "fp"))
    writer.write_file(tmp_path, capture(conversation, _record(4, 40), "fp"))
    small, big = (tmp_path / "3.entry").stat().st_size, (tmp_path / "4.entry").stat().st_size
    assert small < big
    loaded, _ = load_entry(tmp_path / "3.entry", "fp", 3)
    assert layer_caches.entry_length(loaded.layers) == 12
    np.testing.assert_array_equal(
        np.array(loaded.layers[0].keys), np.array(layers[0].keys)[..., :12, :]
    )


def test_checkpoints_are_written_with_their_states(tmp_path):
    caches = LAYOUTS["hybrid-float32"](30)
    layers, end = layer_caches.store_entry(caches)
    mid = layer_caches.StateSnapshot(layer_caches.snapshot_state_single(caches).layers, 20)
    entry = StoredEntry(layers, 30, {30: end, 20: mid, 25: mid})
    record = _record(5, 30, checkpoints=[(20, "reply")])  # 25 was dropped by thinning
    writer.write_file(tmp_path, capture(entry, record, "fp"))
    loaded, _ = load_entry(tmp_path / "5.entry", "fp", 5)
    assert sorted(loaded.states) == [20, 30]
    with pytest.raises(ValueError):
        capture(entry, _record(5, 30, checkpoints=[(10, "guard")]), "fp")  # no state at 10


def _damage(kind: str, path: Path) -> None:
    raw = bytearray(path.read_bytes())
    if kind == "truncated-body":
        raw = raw[:-100]
    elif kind == "truncated-header":
        raw = raw[:40]
    elif kind == "header-bit-flip":
        raw[60] ^= 0x10
    elif kind == "body-bit-flip":
        raw[-200] ^= 0x01
    elif kind == "foreign-version":
        raw[8:12] = (file_format.FORMAT_VERSION + 1).to_bytes(4, "little")
    elif kind == "garbage":
        raw = bytearray(b"not an entry file at all" * 10)
    elif kind == "empty":
        raw = bytearray()
    path.write_bytes(bytes(raw))


DAMAGE = {  # kind -> found by the header scan (else only by the load's body checksum)
    "truncated-body": True,
    "truncated-header": True,
    "header-bit-flip": True,
    "body-bit-flip": False,
    "foreign-version": True,
    "garbage": True,
    "empty": True,
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_file_is_reported_and_never_loaded(tmp_path, kind, caplog):
    store = DiskStore(tmp_path, "fp")
    store.write(_entry("hybrid-float32"), _record(9, 30))
    store.close(10)
    _damage(kind, tmp_path / "9.entry")
    (found,) = scan_directory(tmp_path).files
    assert (found.problem is not None) is DAMAGE[kind] and (found.header is None) is DAMAGE[kind]
    with pytest.raises(file_format.DamagedFile):
        load_entry(tmp_path / "9.entry", "fp", 9)
    fresh = DiskStore(tmp_path, "fp")  # nothing queued: the load reads the file
    assert fresh.load(9) is None and fresh.load_failures == 1
    assert "damaged" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["9.damaged"]  # quarantined
    (found,) = scan_directory(tmp_path).files
    assert found.problem and found.entry_id == 9


def test_a_file_of_another_model_or_entry_id_is_not_loaded(tmp_path):
    writer.write_file(tmp_path, capture(_entry("bfloat16"), _record(2, 30), "fp-old"))
    with pytest.raises(file_format.DamagedFile, match="fingerprint"):
        load_entry(tmp_path / "2.entry", "fp-new", 2)
    os.rename(tmp_path / "2.entry", tmp_path / "3.entry")
    (found,) = scan_directory(tmp_path).files
    assert found.problem == "header names entry 2"


def test_a_queued_write_serves_a_load_and_a_superseded_one_is_dropped(tmp_path, monkeypatch):
    gate, started = threading.Event(), threading.Event()
    real = writer.write_file

    def slow_write(directory, job):
        started.set()
        gate.wait(10)
        return real(directory, job)

    monkeypatch.setattr(writer, "write_file", slow_write)
    store = DiskStore(tmp_path, "fp")
    entry = _entry("hybrid-float32")
    store.write(entry, _record(1, 30))
    assert started.wait(10)
    store.write(entry, _record(2, 30))
    store.write(entry, _record(3, 30))
    assert store.load(3) is not None, "a queued write serves a load from memory"
    store.delete(2)  # superseded before its write started: dropped
    store.delete(1)  # being written: deleted after
    gate.set()
    assert store.flush(10)
    stats = store.stats()["writer"]
    assert (stats["files"], stats["dropped"], stats["deleted"]) == (2, 1, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.entry"]


def test_scan_removes_temporary_files_of_dead_writers_only(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (tmp_path / f".5.{dead}.tmp").write_bytes(b"partial")
    (tmp_path / f".6.{os.getppid()}.tmp").write_bytes(b"a live writer's")
    scan = scan_directory(tmp_path)
    assert [p.name for p in scan.removed_temps] == [f".5.{dead}.tmp"]
    assert scan.max_id == 6 and scan.files == ()
    assert [p.name for p in tmp_path.iterdir()] == [f".6.{os.getppid()}.tmp"]


CRASH_WRITER = """
import sys, time
import numpy as np
from engine.runtime import layer_caches
from engine.runtime.tier.ram import StoredEntry
from engine.storage.disk_store import DiskStore
from engine.cache.messages import EntryRecord
from tests.storage.test_disk_files import LAYOUTS

n = 2048  # ~2 MB of KV per file
layers, state = layer_caches.store_entry(LAYOUTS["hybrid-float32"](n))
entry = StoredEntry(layers, n, {n: state})
store = DiskStore(sys.argv[1], "fp")
for i in range(1, 400):
    toks = np.arange(i * 10_000, i * 10_000 + n, dtype=np.int32)
    store.write(entry, EntryRecord(i, "", "conversation", toks, n, (), 1, 1))
print("queued", flush=True)
time.sleep(120)
"""


def test_kill_9_while_writing_loses_no_complete_file(tmp_path):
    """SIGKILL the writer mid-stream: temporary files are removed, every complete file hits."""
    from engine.cache.manager import CacheManager
    from engine.cache.messages import PlanRequest
    from engine.config import CacheConfig

    directory = file_format.entries_dir(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(directory)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout.readline().strip() == b"queued"
        deadline, mid_write = time.monotonic() + 60, False
        while not mid_write and time.monotonic() < deadline:  # kill it with a write under way
            names = [p.name for p in directory.iterdir()]
            mid_write = sum(n.endswith(".entry") for n in names) >= 3 and any(
                n.endswith(".tmp") for n in names
            )
        proc.send_signal(signal.SIGKILL)
        assert mid_write
    finally:
        proc.kill()
        proc.wait(10)
    complete = sorted(int(p.stem) for p in directory.glob("*.entry"))
    assert len(complete) >= 3
    scan = scan_directory(directory)
    assert all(f.problem is None for f in scan.files)
    assert not list(directory.glob(".*.tmp"))
    for entry_id in complete:  # every complete file loads, checksums and all
        loaded, _ = load_entry(directory / f"{entry_id}.entry", "fp", entry_id)
        assert loaded.length == 2048
    config = CacheConfig(cache_dir=str(tmp_path))
    opened = open_cache_directory(config, "fp")
    manager = CacheManager(config, fingerprint="fp", disk_index=opened.index)
    try:
        assert manager.stats().disk_entries == len(complete)
        last = complete[-1]
        prompt = np.arange(last * 10_000, last * 10_000 + 2100, dtype=np.int32)
        plan = manager.plan(PlanRequest("after-crash", prompt))
        assert (plan.entry_id, plan.length, plan.load_from_disk) == (last, 2048, True)
        assert plan.new_entry_id > max(complete)
    finally:
        opened.close()


def test_a_superseded_file_goes_once_its_successor_is_durable_or_lost(tmp_path, monkeypatch):
    """An absorbed source's file stays while its successor is written. Durable, it goes; lost,
    it goes too (the index forgot it when it ordered the write), and the loss is reported."""
    from dataclasses import replace

    store = DiskStore(tmp_path, "fp")
    entry = _entry("hybrid-float32")
    store.write(entry, _record(1, 30))
    store.write(entry, _record(4, 30))
    assert store.flush(10)
    real = writer.write_file
    seen = []

    def failing_write(directory, job):
        seen.append(sorted(p.name for p in directory.iterdir()))
        if job.entry_id == 2:
            raise OSError("disk full")
        return real(directory, job)

    monkeypatch.setattr(writer, "write_file", failing_write)
    store.write(entry, replace(_record(2, 30), supersedes=(1,)))  # fails: 1 goes too
    store.write(entry, replace(_record(3, 30), supersedes=(4,)))  # durable: 4 goes
    assert store.flush(10)
    assert seen == [["1.entry", "4.entry"], ["4.entry"]], "a file went before its successor"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.entry"]
    assert store.take_lost() == [2]


def test_reading_the_files_sizes_interns_no_file_name(tmp_path, monkeypatch):
    """`file_sizes` runs on every `stats` read of the cache manager. A `Path` per file
    interns its name (pathlib's parse), and with a new name per file, read after read,
    the interpreter's interned-string table churned until it resized: a 1.8 MiB step
    in a 60-minute soak's cache manager. The sizes come from the names as strings."""
    from engine.storage.directory import file_sizes

    for entry_id in range(1, 41):
        (tmp_path / f"{entry_id}.entry").write_bytes(b"x" * entry_id)
    (tmp_path / "7.damaged").write_bytes(b"y" * 3)
    (tmp_path / f".9.{os.getpid()}.tmp").write_bytes(b"z")
    interned = []
    real = sys.intern
    monkeypatch.setattr(sys, "intern", lambda s: interned.append(s) or real(s))
    sizes = file_sizes(tmp_path)
    assert sizes == {i: i + (3 if i == 7 else 0) for i in range(1, 41)}
    assert interned == [], interned[:5]
    assert file_format.file_id(tmp_path / "12.entry") == 12  # a Path is still taken
    assert file_format.file_id("12.tmp") is None


def test_the_replicas_writes_reads_and_deletes_intern_no_file_name(tmp_path, monkeypatch):
    """A model replica's writer writes a file per entry it stores and deletes one per entry
    superseded or evicted; its reader reads one per restore from disk. A `Path` built on a
    new name, each time, interns that name (pathlib's parse), and the interpreter's
    interned-string table churns a file at a time until it resizes: the step the cache
    manager took from `file_sizes`. Their paths are joined as strings."""
    store = DiskStore(tmp_path, "fp")
    fresh = DiskStore(tmp_path, "fp")  # nothing queued: its loads read the files
    interned = []
    real = sys.intern
    monkeypatch.setattr(sys, "intern", lambda s: interned.append(s) or real(s))
    for entry_id in (5, 6):
        store.write(_entry("hybrid-float32"), _record(entry_id, 30))
    assert store.flush(10)
    with open(os.path.join(tmp_path, "6.entry"), "r+b") as f:
        f.write(b"garbage!")  # its load fails: the file is renamed 6.damaged
    assert fresh.load(5) is not None
    assert fresh.load(6) is None
    assert sorted(os.listdir(tmp_path)) == ["5.entry", "6.damaged"]
    store.delete(5)
    store.delete(6)
    assert store.flush(10)
    assert os.listdir(tmp_path) == []
    store.close(10)
    fresh.close(10)
    names = [s for s in interned if s.endswith((".entry", ".damaged", ".tmp"))]
    assert names == [], names[:5]
