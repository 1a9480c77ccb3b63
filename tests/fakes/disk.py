"""The disk tier's fakes: real entry files, an actor that writes them, a driver over both.

`write_fake_file` writes a real entry file (real header and checksums, a
dummy body); `FakeDiskActor` is a FakeModelActor that also writes, deletes
and reads such files behind an ordered queue, as the real writer does, and
`DiskDriver` a Driver with the disk tier on in a directory of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from engine.cache import CacheManager
from engine.cache.messages import (
    Orders,
    RestorePlan,
)
from engine.config import CacheConfig
from engine.storage import file_format, writer
from engine.storage.directory import delete_files, open_cache_directory, scan_directory
from tests.fakes.driver import Driver
from tests.fakes.model_actor import FakeModelActor, Stored


def write_fake_file(directory, record, fingerprint: str = "fake", body_bytes: int = 64) -> None:
    """A real entry file (engine.storage.file_format, header and checksums) with a dummy body.

    Enough for the scan and the policy (headers only); not loadable into MLX.
    """

    meta = {
        "fingerprint": fingerprint,
        "entry_id": record.entry_id,
        "namespace": record.namespace,
        "role": record.role,
        "length": len(record.tokens),
        "prompt_len": record.prompt_len,
        "checkpoints": [list(c) for c in record.checkpoints],
        "kv_bytes_per_token": record.kv_bytes_per_token,
        "state_bytes": record.state_bytes,
        "created": 0.0,
        "layers": [],
        "states": [],
    }
    body = np.full(body_bytes, record.entry_id % 251, dtype=np.uint8)
    job = writer.WriteJob(
        record.entry_id, meta, np.asarray(record.tokens, np.int32), [body], ["uint8"]
    )
    writer.write_file(directory, job)


@dataclass
class FakeDiskActor(FakeModelActor):
    """A FakeModelActor that also writes, deletes and loads entry files (real headers).

    Like the real disk writer it keeps its operations in order behind a queue
    that `paused` holds back until `flush()`: a delete drops a write not
    started yet, and a load reads a queued write from the queue (only this
    writer's own reader sees it), never from the directory.
    """

    directory: object = None  # the entries directory
    fingerprint: str = "fake"
    loads: int = 0
    paused: bool = False
    queue: list = field(default_factory=list)  # ("write", EntryRecord) | ("delete", id)
    written: list = field(default_factory=list)  # (id, bytes) written since take_written()

    def load(self, plan: RestorePlan) -> bool:
        """Read a plan's restore source (`read`) and store it, unless the entry held serves
        the plan (as RamTier.prepare); False when the file is missing or damaged."""

        if self.serves(plan):
            return True
        entry = self.read(plan.entry_id)
        if entry is None:
            return False
        self.stored[plan.entry_id] = entry
        return True

    def read(self, entry_id: int) -> Stored | None:
        """An entry from its queued write or its file, not kept (None: missing or damaged)."""
        queued = self._queued(entry_id)
        if queued is not None:
            found, length, points = queued.tokens, len(queued.tokens), queued.checkpoints
        else:
            try:
                header = file_format.read_header(file_format.entry_path(self.directory, entry_id))
            except (FileNotFoundError, file_format.DamagedFile):
                return None
            assert header.fingerprint == self.fingerprint and header.entry_id == entry_id
            found, length, points = header.tokens, header.length, header.checkpoints
        self.loads += 1
        return Stored(np.array(found), {n for n, _ in points} | {length})

    def serves(self, plan: RestorePlan) -> bool:
        """Whether the entry held serves the plan's restore (no file read needed)."""
        held = self.stored.get(plan.entry_id)
        return held is not None and (plan.length in held.states or not self.state_layers)

    def apply(self, orders: Orders) -> None:
        """Moves and drops, then deletes, writes (the entry as it is now) and frees, in
        RamTier.apply's order."""

        super().apply(Orders(moves=orders.moves, drop_checkpoints=orders.drop_checkpoints))
        for entry_id in orders.delete_files:
            dropped = self._queued(entry_id)
            if dropped is None:
                self.queue.append(("delete", entry_id))
                continue
            # Not started: dropped, with the files it was to replace (as the real writer).
            self.queue = [op for op in self.queue if op[1] is not dropped]
            self.queue += [("delete", old) for old in dropped.supersedes]
        assert tuple(r.entry_id for r in orders.records) == orders.write
        for record in orders.records:
            held = self.stored.get(record.entry_id)
            assert held is not None, f"write of entry {record.entry_id}, which is not held"
            assert np.array_equal(held.tokens, record.tokens), record.entry_id
            lengths = {n for n, _ in record.checkpoints} | {len(record.tokens)}
            assert held.states == lengths, (record.entry_id, held.states, lengths)
            self.queue.append(("write", record))
        super().apply(Orders(rejoin=orders.rejoin, free=orders.free))
        if not self.paused:
            self.flush()

    def flush(self) -> list[int]:
        """Carry out the queued writes and deletes in order; the ids written."""
        done, self.queue = self.queue, []
        for op, item in done:
            if op == "delete":
                delete_files(self.directory, item)
                continue
            write_fake_file(self.directory, item, self.fingerprint)
            for superseded in item.supersedes:  # after the successor's file is durable
                delete_files(self.directory, superseded)
            path = file_format.entry_path(self.directory, item.entry_id)
            self.written.append((item.entry_id, path.stat().st_size))
        return [item.entry_id for op, item in done if op == "write"]

    def take_written(self) -> list[tuple[int, int]]:
        """(id, bytes) written since the last call (what the real writer reports durable)."""
        written, self.written = self.written, []
        return written

    def _queued(self, entry_id: int):
        return next((r for op, r in self.queue if op == "write" and r.entry_id == entry_id), None)

    def files(self, damaged: bool = False) -> set[int]:
        """Ids of the sound files of this fingerprint (or, `damaged`, of the damaged ones)."""

        scanned = scan_directory(self.directory, remove_temps=False).files
        if damaged:
            return {f.entry_id for f in scanned if f.problem is not None}
        return {
            f.entry_id
            for f in scanned
            if f.header is not None and f.header.fingerprint == self.fingerprint
        }


class DiskDriver(Driver):
    """A Driver with the disk tier on, in `directory` (its own cache_dir)."""

    def __init__(
        self,
        directory,
        config: CacheConfig | None = None,
        state_layers: bool = True,
        fingerprint: str = "fake",
        **knobs,
    ) -> None:

        config = replace(config or CacheConfig(**knobs), cache_dir=str(directory))
        self.opened = open_cache_directory(config, fingerprint)
        manager = CacheManager(
            config,
            fingerprint=fingerprint,
            has_state_layers=state_layers,
            disk_index=self.opened.index if self.opened else None,
        )
        assert manager.disk_index is not None, "the disk tier did not open"
        actor = FakeDiskActor(
            state_layers=state_layers,
            directory=file_format.entries_dir(directory, config.mode),
            fingerprint=fingerprint,
        )
        self._start(manager, actor)

    def restore(self, request_id: str) -> bool:
        plan = self._requests[request_id][0]
        if not self.ready(plan):
            return False
        if plan.load_from_disk and not self.actor.serves(plan):
            if not self.room(request_id):
                return False  # the Orders making room for the file's entry are on their way
            assert self.actor.load(plan), f"file of entry {plan.entry_id} did not load"
        return super().restore(request_id)

    def commit(self, request_id: str, reply=(), taken=None, cold: bool = False, upto=None):
        """As Driver.commit; a restore whose file fails falls back to cold (as the actor)."""
        plan = self._requests[request_id][0]
        if request_id not in self._restored and not self.ready(plan):
            self.deliver()
        if plan.load_from_disk and request_id not in self._restored and not cold:
            if not self.actor.serves(plan) and not self.room(request_id):
                self.deliver()  # the actor waits for its room's Orders
            cold = not self.actor.load(plan)
        return super().commit(request_id, reply, taken, cold, upto)

    def close(self) -> None:
        if self.opened is not None:
            self.opened.close()

    def check(self) -> None:
        """The manager's invariants; the actor holds the index, deferred and pending frees; the
        files of this fingerprint are the disk index's entries."""
        self.manager.check_invariants()
        self.check_budget()
        if self.link.in_transit:
            return
        index = self.manager.index
        loading = set(self.manager.unread)  # the actor may not have read these files yet
        for entry in index.entries():
            held = self.actor.stored.get(entry.id)
            if held is None and entry.id in loading:
                continue
            assert held is not None, f"indexed entry {entry.id} is not held by the actor"
            assert held.states == set(entry.checkpoints) | {entry.length}, (entry.id, held.states)
            assert self.actor.bytes_of(entry.id) == entry.nbytes, (entry.id, "bytes differ")
        pending = self.manager.pending_orders
        expected = ({e.id for e in index.entries()} | set(index.deferred)) - loading
        assert expected <= set(self.actor.stored) <= expected | loading | set(pending.free)
        if self.actor.queue:
            return  # the writer holds writes back: the disk is behind the index
        disk_index = self.manager.disk_index
        own = {i for i, f in disk_index.files.items() if f.entry is not None} - set(pending.write)
        own -= self.actor.files(damaged=True)  # damaged since the scan: found at a load
        assert self.actor.files() == own, (sorted(self.actor.files()), sorted(own))
