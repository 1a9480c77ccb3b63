"""The disk tier's policy: which files are written, deleted, evicted and read.

Driven by DiskDriver: the real CacheManager with its disk index, and a fake
model actor that writes real entry files (headers and checksums, a dummy
body), so a second manager on the same directory is a restart that scans
them. Token ids are plain ranges, as in test_cache_policy.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine.cache.disk_index import DiskFile, DiskIndex, disk_priority
from engine.cache.entry import Entry
from engine.cache.messages import EntryRecord
from engine.config import CacheConfig
from engine.runtime.model.fingerprint import library_versions, model_fingerprint
from tests.fakes import KVPT, STATE, DiskDriver, tokens, write_fake_file


def seq(start: int, n: int) -> range:
    return range(start, start + n)


P1 = seq(1000, 600)  # system + tools (the first 300 tokens) + a user message
R1 = seq(5000, 20)
U2 = seq(6000, 40)
ANCHOR = 300


def first_turn(d: DiskDriver):
    return d.turn(P1, R1, anchor_len=ANCHOR)


def test_each_entry_and_anchor_is_written_when_indexed(tmp_path):
    d = DiskDriver(tmp_path)
    plan, orders = first_turn(d)
    assert (plan.new_entry_id, [c.entry_id for c in plan.captures]) == (1, [2, None])
    assert orders.write == (2, 1) and orders.delete_files == ()
    anchor, entry = orders.records
    assert (anchor.role, len(anchor.tokens), anchor.checkpoints) == ("anchor", ANCHOR, ())
    assert (entry.role, entry.prompt_len) == ("conversation", 600)
    assert entry.checkpoints == ((584, "guard"), (600, "reply"))
    assert d.actor.files() == {1, 2}


def test_an_absorbed_entry_file_goes_after_its_successor_is_written(tmp_path):
    d = DiskDriver(tmp_path)
    first_turn(d)
    plan, orders = d.turn(tokens(P1, R1, U2), seq(7000, 10), anchor_len=ANCHOR)
    assert (plan.entry_id, plan.length, plan.kind, plan.load_from_disk) == (1, 620, "entry", False)
    assert orders.write == (plan.new_entry_id,) and orders.delete_files == ()
    assert orders.records[0].supersedes == (1,), "deleted once the successor is durable"
    assert 1 in orders.free
    assert d.actor.files() == {2, plan.new_entry_id}


def test_an_absorbed_entry_file_stays_when_its_successor_gets_no_file(tmp_path):
    """Over the disk budget the successor is not written: the source's file is all there is."""
    d = DiskDriver(tmp_path, disk_budget=_entry_file_bytes(620, 2) + 10)
    d.turn(P1, R1)
    plan, orders = d.turn(tokens(P1, R1, U2), seq(7000, 10))
    assert (plan.entry_id, orders.write, orders.delete_files) == (1, (), ())
    assert d.actor.files() == {1} and 1 in d.manager.disk_index
    d.close()
    d = DiskDriver(tmp_path)
    assert d.plan(tokens(P1, R1, U2)).load_from_disk, "the source's file still restores"


def test_restart_restores_conversations_and_anchors_from_their_files(tmp_path):
    d = DiskDriver(tmp_path)
    first_turn(d)
    d.close()
    d = DiskDriver(tmp_path)  # a restart: the index is rebuilt from the headers
    assert d.manager.stats().disk_entries == 2 and d.manager.index.entries() == []
    plan = d.plan(tokens(P1, R1, U2), anchor_len=ANCHOR)
    assert (plan.entry_id, plan.length, plan.kind, plan.load_from_disk) == (1, 620, "entry", True)
    assert plan.new_entry_id == 3, "ids start above every id on disk"
    orders = d.commit(plan.request_id, seq(7000, 10))
    assert orders.write == (3,) and orders.records[0].supersedes == (1,)
    # A new session: the anchor is on disk only, and longer than anything in RAM.
    plan = d.plan(tokens(seq(1000, ANCHOR), seq(9000, 50)), anchor_len=ANCHOR)
    restore = (plan.entry_id, plan.length, plan.kind, plan.load_from_disk)
    assert restore == (2, ANCHOR, "anchor", True)
    d.commit(plan.request_id, seq(9500, 5))
    # Now in RAM: the next use of the anchor reads no file.
    plan = d.plan(tokens(seq(1000, ANCHOR), seq(9100, 50)), anchor_len=ANCHOR)
    assert (plan.entry_id, plan.kind, plan.load_from_disk) == (2, "anchor", False)
    d.commit(plan.request_id)
    assert d.actor.loads == 2


def test_disk_is_read_only_for_a_longer_restore_point_than_ram(tmp_path):
    d = DiskDriver(tmp_path)
    first_turn(d)
    d.close()
    d = DiskDriver(tmp_path)
    d.turn(tokens(seq(1000, ANCHOR), seq(9000, 50)), anchor_len=ANCHOR)  # loads the anchor
    # RAM offers the anchor (300); the conversation's file offers 620.
    plan = d.plan(tokens(P1, R1, U2), anchor_len=ANCHOR)
    assert (plan.entry_id, plan.length, plan.load_from_disk) == (1, 620, True)
    d.commit(plan.request_id)
    # A prompt that RAM serves at least as far as any file: no file read.
    plan = d.plan(tokens(seq(1000, ANCHOR), seq(8000, 50)), anchor_len=ANCHOR)
    assert (plan.kind, plan.length, plan.load_from_disk) == ("anchor", ANCHOR, False)


def _dir_bytes(d: DiskDriver) -> int:
    from engine.storage import file_format

    return sum(file_format.entry_path(d.actor.directory, i).stat().st_size for i in d.actor.files())


def test_a_superseded_file_counts_in_the_budget_until_its_successor_is_written(tmp_path):
    """The writer deletes an absorbed entry's file only once its successor's is durable:
    until then both are on disk, and the budget holds both, never less than the disk."""
    d = DiskDriver(tmp_path)
    first_turn(d)
    d.manager.files_written(d.actor.take_written())
    d.actor.paused = True  # the successor's write is queued, not done
    plan, _ = d.turn(tokens(P1, R1, U2), seq(7000, 10), anchor_len=ANCHOR)
    assert 1 not in d.manager.disk_index and {1, 2} <= d.actor.files()
    queued = d.manager.disk_index.files[plan.new_entry_id].nbytes  # not on disk yet
    assert d.manager.disk_index.nbytes - queued == _dir_bytes(d), "the old file left early"
    d.actor.paused = False
    d.actor.flush()
    d.manager.files_written(d.actor.take_written())
    assert d.actor.files() == {2, plan.new_entry_id}
    assert d.manager.disk_index.nbytes == _dir_bytes(d), "the old file's bytes were let go"


def test_a_file_larger_than_its_estimate_is_made_room_for_when_reported(tmp_path):
    budget = 2 * _entry_file_bytes(620, 2) + 1000
    d = DiskDriver(tmp_path, disk_budget=budget)
    ids = [d.turn(seq(100_000 * (k + 1), 600), seq(5000, 20))[0].new_entry_id for k in range(2)]
    d.actor.take_written()
    orders = d.manager.files_written([(ids[1], budget // 2 + 5000)])  # bigger than estimated
    assert orders.delete_files == (ids[0],), "the budget was left over until the next write"
    assert d.manager.disk_index.nbytes <= budget


def _entry_file_bytes(n_tokens: int, checkpoints: int) -> int:
    from engine.cache.disk_index import HEADER_BYTES

    return n_tokens * KVPT + STATE * (1 + checkpoints) + 4 * n_tokens + HEADER_BYTES


def test_disk_budget_holds_under_a_stream_of_distinct_prompts(tmp_path):
    budget = 4 * _entry_file_bytes(620, 2) + 1000
    d = DiskDriver(tmp_path, disk_budget=budget)
    ids = []
    for k in range(12):
        plan, _ = d.turn(seq(100_000 * (k + 1), 600), seq(50_000 * (k + 1), 20))
        ids.append(plan.new_entry_id)
        assert d.manager.disk_index.nbytes <= budget
    stats = d.manager.stats()
    assert stats.disk_entries == 4 and stats.disk_evictions == 8
    assert d.actor.files() == set(ids[-4:]), "least recently used files go first"


def test_a_timestamp_series_does_not_pin_anchor_files_forever(tmp_path):
    """Each request's system prompt holds a new timestamp: a new anchor every time."""
    budget = 10 * _entry_file_bytes(ANCHOR, 0)
    d = DiskDriver(tmp_path, disk_budget=budget, anchor_max_entries=3)
    anchors = []
    for minute in range(15):
        system = tokens(seq(1000, 280), [90_000 + minute], seq(2000, 19))
        plan, _ = d.turn(
            tokens(system, seq(10_000 * (minute + 1), 300)), seq(7000, 5), anchor_len=ANCHOR
        )
        anchors.append(plan.captures[0].entry_id)
        assert d.manager.disk_index.nbytes <= budget
    files = d.actor.files()
    assert set(anchors[-3:]) <= files, "the pinned (newest) anchors outlive the conversations"
    assert not set(anchors[:8]) & files, "older anchors were evicted, not pinned forever"


@pytest.mark.parametrize("spill", [True, False])
def test_ram_eviction_spills_an_entry_whose_file_was_evicted(tmp_path, spill):
    one = 620 * KVPT + 3 * STATE
    d = DiskDriver(
        tmp_path,
        ram_budget=3 * one,
        disk_budget=2 * _entry_file_bytes(620, 2) + 10,
        spill_on_evict=spill,
    )
    ids = [d.turn(seq(100_000 * (k + 1), 600), seq(5000, 20))[0].new_entry_id for k in range(3)]
    assert ids[0] not in d.manager.disk_index and ids[0] in d.manager.index  # disk LRU evicted it
    _, orders = d.turn(seq(900_000, 600), seq(5000, 20))  # RAM evicts ids[0]
    assert ids[0] in orders.free
    assert (ids[0] in orders.write) is spill
    assert (ids[0] in d.actor.files()) is spill


def test_disk_eviction_order_damaged_foreign_lru_then_pinned_anchors():
    def entry(entry_id: int, role: str) -> Entry:
        return Entry(
            entry_id,
            "",
            role,
            np.arange(entry_id * 100, entry_id * 100 + 20, dtype=np.int32),
            20,
            KVPT,
            STATE,
        )

    index = DiskIndex(budget=0, anchor_max_entries=2)
    index.add(entry(7, "anchor"), 10)  # oldest anchor: not among the 2 newest, so not pinned
    index.add_other(1, 10, "damaged")
    index.add(entry(3, "conversation"), 10)
    index.add_other(2, 10, "foreign")
    index.add(entry(4, "anchor"), 10)
    index.add(entry(5, "conversation"), 10)
    index.add(entry(6, "anchor"), 10)
    index.check()
    assert index.pinned_anchors() == {4, 6}
    assert [f.entry_id for f in index.victims()] == [1, 2, 7, 3, 5, 4, 6]
    assert [f.entry_id for f in index.victims(keep={3})] == [1, 2, 7, 5, 4, 6]
    index.budget = 50
    assert [f.entry_id for f in index.victims()] == [1, 2]
    assert disk_priority(DiskFile(9, 1, 1, None, "damaged"), set()) < (1, 0)


def _record(entry_id: int, toks, role="conversation") -> EntryRecord:
    toks = np.asarray(toks, np.int32)
    return EntryRecord(entry_id, "", role, toks, len(toks), (), KVPT, STATE)


def test_foreign_and_damaged_files_are_counted_never_matched(tmp_path):
    from engine.storage.file_format import entries_dir

    directory = entries_dir(tmp_path)
    directory.mkdir(parents=True)
    write_fake_file(directory, _record(40, P1), fingerprint="another-model")
    write_fake_file(directory, _record(41, P1))
    path = directory / "41.entry"
    raw = bytearray(path.read_bytes())
    raw[30] ^= 0xFF  # a flipped bit in the header
    path.write_bytes(bytes(raw))
    d = DiskDriver(tmp_path)
    stats = d.manager.stats()
    assert (stats.disk_entries, stats.damaged_files) == (0, 1)
    assert stats.disk_bytes == sum(p.stat().st_size for p in directory.glob("*.entry"))
    plan = d.plan(tokens(P1, U2))
    assert (plan.kind, plan.load_from_disk, plan.new_entry_id) == ("none", False, 42)


def test_a_file_that_fails_to_load_is_a_cold_miss_then_forgotten(tmp_path):
    d = DiskDriver(tmp_path)
    first_turn(d)
    d.close()
    d = DiskDriver(tmp_path)
    path = d.actor.directory / "1.entry"
    path.write_bytes(path.read_bytes()[:100])  # truncated after the scan
    plan = d.plan(tokens(P1, R1, U2))
    assert (plan.entry_id, plan.load_from_disk) == (1, True)
    d.commit(plan.request_id)  # the actor falls back to a cold prefill
    assert d.manager.stats().damaged_files == 1 and 1 not in d.manager.disk_index
    assert d.manager.stats().restores_lost == 1
    plan = d.plan(tokens(P1, R1, U2))
    # not a cold miss, nor the forgotten file: the entry the cold prefill stored, whole
    restore = (plan.entry_id, plan.length, plan.kind, plan.load_from_disk)
    assert restore == (3, 660, "entry", False)


def _model_dir(root):
    root.mkdir()
    (root / "model.safetensors").write_bytes(b"w" * 64)
    (root / "tokenizer.json").write_text('{"v": 1}')
    (root / "config.json").write_text('{"model_type": "qwen3_next"}')
    return root


def _touch(root):
    st = (root / "model.safetensors").stat()
    os.utime(root / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


@pytest.mark.parametrize(
    "change, kv",
    [
        (_touch, ("float32", None)),  # a rewritten weight file: another mtime
        (lambda r: (r / "model.safetensors").write_bytes(b"w" * 65), ("float32", None)),  # size
        (lambda r: (r / "tokenizer.json").write_text('{"v": 2}'), ("float32", None)),
        (lambda r: None, ("bfloat16", None)),  # another KV dtype
        (lambda r: None, ("float32", 4)),  # KV quantization
        (lambda r: None, ("float32", None, 64, {**library_versions(), "mlx": "0.0.1"})),
        (lambda r: None, ("float32", None, 64, {**library_versions(), "mlx_lm": "0.0.1"})),
        (lambda r: None, ("float32", None, 64, {**library_versions(), "entry_format": "0"})),
    ],
    ids=[
        "weights-mtime",
        "weights-size",
        "tokenizer",
        "kv-dtype",
        "kv-bits",
        "mlx",
        "mlx-lm",
        "entry-format",
    ],
)
def test_invalidation_is_a_miss_never_a_wrong_hit(tmp_path, change, kv):
    model = _model_dir(tmp_path / "model")
    before = model_fingerprint(model, "float32")
    d = DiskDriver(tmp_path / "cache", fingerprint=before)
    first_turn(d)
    d.close()
    change(model)
    after = model_fingerprint(model, *kv)
    assert after != before
    d = DiskDriver(tmp_path / "cache", fingerprint=after)
    assert d.manager.stats().disk_entries == 0 and d.manager.disk_index.nbytes > 0
    plan = d.plan(tokens(P1, R1, U2), anchor_len=ANCHOR)
    assert (plan.kind, plan.load_from_disk) == ("none", False)
    d.close()
    d = DiskDriver(tmp_path / "cache", fingerprint=before)  # the old model again: still warm
    assert d.plan(tokens(P1, R1, U2)).load_from_disk


def test_exact_mode_writes_both_snapshots_of_every_request_in_its_own_directory(tmp_path):
    """The baseline pays the old tier's disk cost: two whole-prompt files per request."""
    d = DiskDriver(tmp_path, CacheConfig(mode="exact"))
    plan, orders = d.turn(P1, R1)
    assert [c.kind for c in plan.captures] == ["snapshot"]
    assert orders.write == (plan.captures[0].entry_id, plan.new_entry_id)
    assert [len(r.tokens) for r in orders.records] == [len(P1) - 16, len(P1)]
    assert all(r.role == "snapshot" for r in orders.records)
    assert d.actor.files() == set(orders.write)
    assert (tmp_path / "entries-exact").is_dir() and not (tmp_path / "entries").exists()
