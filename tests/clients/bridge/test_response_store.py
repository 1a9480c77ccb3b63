"""The Responses store (clients.bridge.response_store): per tenant, bounded in count and
bytes, least recently used first, evictions said as such, and kept on disk: private
files written atomically that a new store (a restart) reads back."""

from __future__ import annotations

import os
import stat
import sys
import uuid

import pytest

from clients.bridge import response_store
from clients.bridge.response_store import Record, ResponseStore, StoredNotFound, tenant_key
from tests.child import run_python


def _record(tenant: str, text: str = "hello", rid: str | None = None) -> Record:
    rid = rid or f"resp_{uuid.uuid4().hex}"
    conversation = ({"role": "user", "content": text}, {"role": "assistant", "content": "hi"})
    return Record(rid, tenant_key(tenant), {"id": rid, "object": "response"}, conversation, ("c1",))


@pytest.mark.parametrize("directory", [False, True], ids=["memory", "disk"])
def test_a_record_is_its_tenants_alone(tmp_path, directory):
    store = ResponseStore(tmp_path / "r" if directory else None, 10, 1 << 20)
    mine = _record("alice")
    store.put(mine)
    assert store.get("alice", mine.id) == mine
    for other in ("bob", ""):
        with pytest.raises(StoredNotFound) as error:
            store.get(other, mine.id)
        assert not error.value.evicted and "evicted" not in str(error.value)
        with pytest.raises(StoredNotFound):
            store.delete(other, mine.id)
    store.delete("alice", mine.id)
    with pytest.raises(StoredNotFound):
        store.get("alice", mine.id)
    store.close()


@pytest.mark.parametrize("directory", [False, True], ids=["memory", "disk"])
def test_each_get_is_a_record_of_its_own_as_its_file_says(tmp_path, directory):
    """The store holds what it wrote, not the objects it was given or handed out: changing
    the record after `put`, or one a `get` or `held` returned, changes no later read."""
    store = ResponseStore(tmp_path / "r" if directory else None, 10, 1 << 20)
    mine = _record("alice", "as stored")
    store.put(mine)
    mine.response["status"] = "changed by the caller after put"
    first = store.get("alice", mine.id)
    assert "status" not in first.response
    first.response["status"] = "changed by a reader"
    first.conversation[0]["content"] = "changed by a reader"
    for again in (store.get("alice", mine.id), store.held("alice", mine.id)):
        assert again is not first and "status" not in again.response
        assert again.conversation[0]["content"] == "as stored"
    store.close()


def test_the_least_recently_used_go_first_and_say_they_were_evicted(tmp_path):
    store = ResponseStore(tmp_path / "r", 3, 1 << 20)
    a, b, c, d = (_record("alice") for _ in range(4))
    for r in (a, b, c):
        store.put(r)
    store.get("alice", a.id)  # a is used again: b is now the oldest
    store.put(d)
    with pytest.raises(StoredNotFound) as error:
        store.get("alice", b.id)
    assert error.value.evicted and "evicted" in str(error.value)
    with pytest.raises(StoredNotFound) as error:  # another tenant learns nothing
        store.get("bob", b.id)
    assert not error.value.evicted
    assert {r.id for r in (a, c, d)} == {store.get("alice", r.id).id for r in (a, c, d)}
    store.close()
    assert not (tmp_path / "r" / f"{b.id}.json").exists()
    again = ResponseStore(tmp_path / "r", 3, 1 << 20)  # the tombstone outlives a restart
    with pytest.raises(StoredNotFound) as error:
        again.get("alice", b.id)
    assert error.value.evicted
    again.close()


def test_the_byte_bound_evicts_too(tmp_path):
    store = ResponseStore(tmp_path / "r", 100, 3000)
    records = [_record("alice", "x" * 1000) for _ in range(5)]
    for r in records:
        store.put(r)
    assert store.bytes <= 3000 and len(store._sizes) == 2
    with pytest.raises(StoredNotFound):
        store.get("alice", records[0].id)
    assert store.get("alice", records[-1].id).conversation == records[-1].conversation
    store.close()


def test_a_restart_reads_the_records_back_from_private_files(tmp_path):
    directory = tmp_path / "responses"
    store = ResponseStore(directory, 10, 1 << 20)
    kept = [_record("alice", f"turn {i}") for i in range(3)]
    for r in kept:
        store.put(r)
    store.close()  # the writer finishes
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    files = sorted(directory.iterdir())
    assert len(files) == 3 and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert all(f.read_text().splitlines()[0].startswith('{"id":') for f in files)
    again = ResponseStore(directory, 10, 1 << 20)
    for r in kept:
        assert again.get("alice", r.id) == r
    with pytest.raises(StoredNotFound):
        again.get("bob", kept[0].id)
    again.close()


def test_a_damaged_or_foreign_file_is_skipped_and_temporaries_removed(tmp_path):
    directory = tmp_path / "r"
    store = ResponseStore(directory, 10, 1 << 20)
    good = _record("alice")
    store.put(good)
    store.close()
    bad = f"resp_{uuid.uuid4().hex}"
    (directory / f"{bad}.json").write_text("not json\n")
    (directory / ".tmp-half-written").write_text("x")
    (directory / "notes.txt").write_text("not ours")
    again = ResponseStore(directory, 10, 1 << 20)
    assert again.get("alice", good.id) == good
    with pytest.raises(StoredNotFound):
        again.get("alice", bad)
    assert not (directory / ".tmp-half-written").exists()
    again.close()


def test_tighter_bounds_at_a_restart_evict_the_oldest(tmp_path):
    store = ResponseStore(tmp_path / "r", 10, 1 << 20)
    records = [_record("alice") for _ in range(4)]
    for r in records:
        store.put(r)
    store.close()
    for i, r in enumerate(records):  # distinct mtimes, oldest first
        os.utime(tmp_path / "r" / f"{r.id}.json", (1000 + i, 1000 + i))
    again = ResponseStore(tmp_path / "r", 2, 1 << 20)
    with pytest.raises(StoredNotFound) as error:
        again.get("alice", records[0].id)
    assert error.value.evicted
    assert again.get("alice", records[3].id).id == records[3].id
    again.close()


_MEMORY = """
import gc, json, sys, tracemalloc, uuid
from clients.bridge import response_store
from clients.bridge.response_store import Record, ResponseStore, tenant_key

store = ResponseStore(sys.argv[1], 10_000, 1 << 30)
tools = [{"type": "function", "name": "grep", "parameters": {"type": "object"}}]

def put(i):
    rid = f"resp_{uuid.uuid4().hex}"
    response = {"id": rid, "instructions": f"agent {i} " * 300, "tools": tools * 8}
    conversation = ({"role": "user", "content": f"turn {i} " + "x" * 2000},)
    store.put(Record(rid, tenant_key("alice"), response, conversation))
    return rid

def traced():
    store._writer.submit(lambda: None).result()  # the writes asked for are done
    gc.collect()
    mine = [tracemalloc.Filter(True, "<string>"), tracemalloc.Filter(True, response_store.__file__)]
    return sum(t.size for t in tracemalloc.take_snapshot().filter_traces(mine).traces)

tracemalloc.start()
first = put(0)
sizes = []
for block in range(3):
    for i in range(300):
        put(1 + block * 300 + i)
    sizes.append(traced())
tracemalloc.stop()
first_back = store.get("alice", first).response["instructions"].startswith("agent 0 ")
store.close()
print(json.dumps({"sizes": sizes, "first_back": first_back}))
"""


def test_the_records_held_in_memory_stop_growing_while_the_files_go_on(tmp_path):
    """A process that stores every turn holds the latest few hundred parsed, not every
    record its disk bounds allow: its memory levels off within minutes of traffic, and a
    record no longer held is read back from its file. Measured with tracemalloc in a
    process of its own: tracing allocations beside the session's Ray and MLX threads
    crashed the test process."""
    _, out = run_python(_MEMORY, str(tmp_path / "r"))
    sizes = out["sizes"]
    # each record held costs ~6 KB here; what goes on growing, up to the count bound, is
    # the index: its id and size, and its tenant's one string (~0.26 KB; each record's
    # own copy of the tenant's digest made it ~0.38)
    assert sizes[2] - sizes[1] < 300 * 300, sizes
    assert out["first_back"]


_HELD = """
import gc, json, sys, tracemalloc, uuid
from clients.bridge.response_store import MEMORY_RECORDS, Record, ResponseStore, tenant_key

store = ResponseStore(sys.argv[1], 10_000, 1 << 30)

def put(i):
    rid = f"resp_{uuid.uuid4().hex}"
    # an agent's turns: many short messages, each a dict of its own as a request's body is
    conversation = tuple(
        {"role": "tool", "tool_call_id": f"call_{i}_{t}", "content": f"line {t} of file {i}"}
        for t in range(100)
    )
    store.put(Record(rid, tenant_key("alice"), {"id": rid, "status": "completed"}, conversation))

def settled():
    store._writer.submit(lambda: None).result()  # the writes asked for are done
    gc.collect()
    return tracemalloc.get_traced_memory()[0]

tracemalloc.start()
before = settled()
for i in range(MEMORY_RECORDS):
    put(i)
grown = settled() - before
print(json.dumps({"grown": grown, "held": store._memory_bytes, "count": len(store._memory)}))
store.close()
"""


def test_the_records_held_in_memory_cost_their_files_bytes(tmp_path):
    """The memory tier holds each record as its file's bytes, not as the dicts and strings
    it was given (four times the bytes for these short messages): what the
    process grows by, holding a full tier, is those bytes and the index beside them."""
    _, out = run_python(_HELD, str(tmp_path / "r"))
    assert out["count"] == 256 and out["held"] > 1_000_000, out
    assert out["grown"] < 1.1 * out["held"], out


def test_storing_reading_and_evicting_records_interns_no_file_name(tmp_path, monkeypatch):
    """Each request that stores a response writes its file (a temporary name, then its
    own), and evictions write tombstones and remove files. A `Path` per file, on a new
    name each time, interns that name (pathlib's parse): the serve's interned-string table
    churned a few names per request until it resized, a one-off step of a few MiB. The
    store joins its paths as strings."""
    monkeypatch.setattr(response_store, "MEMORY_RECORDS", 1)  # older records: from files
    store = ResponseStore(tmp_path / "r", 2, 1 << 20)
    interned = []
    real = sys.intern
    monkeypatch.setattr(sys, "intern", lambda s: interned.append(s) or real(s))
    records = [_record("alice", f"turn {i}") for i in range(5)]  # 3 evicted, 1 tombstone goes
    for record in records:
        store.put(record)
    store._writer.submit(lambda: None).result()  # the writes are done
    assert store.get("alice", records[-2].id) == records[-2]  # read from its file
    with pytest.raises(StoredNotFound) as error:
        store.get("alice", records[2].id)  # the latest evicted: its tombstone stays
    assert error.value.evicted
    store.delete("alice", records[-1].id)
    store.close()
    assert len(os.listdir(tmp_path / "r")) == 3  # a record and two tombstones
    names = [s for s in interned if "resp_" in s]
    assert names == [], names[:5]
