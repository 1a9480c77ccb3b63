"""The tiers' tensors: the RAM tier, and the disk tier's side that holds MLX arrays.

The RAM tier: stored entries' tensors, keyed by entry id. It obeys, never decides.

An entry holds the append-only layers of one finished sequence (as extracted
from the batch, never cloned) and state snapshots keyed by length: the state at
the entry's own length and at each of its checkpoints. A restore at length n
needs a state snapshot at exactly n (or, for a model without state layers,
none) and reads rows [:n] of the append-only layers.

What to keep, move or drop comes from the cache manager as Orders.

The disk tier (`DiskStore`, over engine.disk's file format and writer
thread): an order to write captures the entry as numpy views over its arrays
(no copy on the loop thread; the arrays are immutable) and queues it; the
writer thread copies and writes it off the hot path. A plan that restores
from a file (`RestorePlan.load_from_disk`) is read into RAM synchronously at
admission (`RamTier.prepare`): one read of the file, a checksum over it and
one copy into MLX arrays, on the loop thread, before the request's prefill;
that is the restart path, paid once per file.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from engine import disk, snapshot
from engine.messages import EntryRecord, Orders, RestorePlan

log = logging.getLogger(__name__)


@dataclass
class StoredEntry:
    layers: list  # append-only layers (snapshot module's stored form), full length
    length: int  # tokens this entry covers (rows of `layers` it may serve)
    states: dict[int, snapshot.StateSnapshot] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        kv = snapshot.kv_bytes_per_token(self.layers) * self.length
        return kv + sum(s.nbytes for s in self.states.values())


class RamTier:
    """Entry id -> StoredEntry, plus the orders that change it (and the disk tier's files)."""

    def __init__(self, has_state_layers: bool, disk_store: DiskStore | None = None):
        self.has_state_layers = has_state_layers
        self.entries: dict[int, StoredEntry] = {}
        self.disk = disk_store

    def put(self, entry_id: int, entry: StoredEntry) -> None:
        assert entry_id not in self.entries, f"entry {entry_id} stored twice"
        self.entries[entry_id] = entry

    def prepare(self, plan: RestorePlan) -> None:
        """Make the plan's restore source readable: load its disk file when the plan says so.

        Synchronous (read, checksum, copy into MLX arrays) on the loop thread; a
        file that fails is logged and left out, and the request prefills cold.
        """
        if not plan.load_from_disk or self.disk is None or plan.entry_id in self.entries:
            return
        entry = self.disk.load(plan.entry_id)
        if entry is not None:
            self.entries[plan.entry_id] = entry

    def can_restore(self, entry_id: int | None, length: int) -> bool:
        entry = self.entries.get(entry_id) if entry_id is not None else None
        if entry is None or length > entry.length:
            return False
        return length in entry.states or not self.has_state_layers

    def restore(self, entry_id: int, length: int, counter=None) -> list:
        """Fresh single-sequence layer caches at `length` (views, no KV copy)."""
        entry = self.entries[entry_id]
        state = entry.states.get(length)
        if state is None:  # no state layers: any snapshot gives the layout
            state = next(iter(entry.states.values()))
        return snapshot.restore(entry.layers, state, length, counter)

    def apply(self, orders: Orders) -> None:
        """Moves (absorption), dropped checkpoints, writes, frees, then file deletes.

        A write captures the entry as it is after the moves and drops, before
        the frees (an entry spilled at its eviction is written as it leaves).
        """
        for move in orders.moves:
            src, dst = self.entries.get(move.src), self.entries.get(move.dst)
            if src is None or dst is None or move.length not in src.states:
                log.warning("move %s: source or destination missing", move)
                continue
            dst.states[move.length] = src.states[move.length]
        for entry_id, length in orders.drop_checkpoints:
            entry = self.entries.get(entry_id)
            if entry is not None and length != entry.length:
                entry.states.pop(length, None)
        if self.disk is not None:
            for record in orders.records:
                entry = self.entries.get(record.entry_id)
                if entry is None:
                    log.warning("write of entry %d: not held", record.entry_id)
                    continue
                try:
                    self.disk.write(entry, record)
                except ValueError:
                    log.exception("write of entry %d skipped", record.entry_id)
        for entry_id in orders.free:
            self.entries.pop(entry_id, None)
        if self.disk is not None:
            for entry_id in orders.delete_files:
                self.disk.delete(entry_id)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())


# --- the disk tier's tensors ----------------------------------------------------


class DiskStore:
    """Files of one model fingerprint: writes through the writer thread, loads on the caller's."""

    def __init__(self, directory: str | Path, fingerprint: str) -> None:
        self.directory = Path(directory)
        self.fingerprint = fingerprint
        self.writer = disk.DiskWriter(self.directory)
        self.loads = 0
        self.load_failures = 0
        self.load_bytes = 0
        self.load_seconds = 0.0

    def write(self, entry: StoredEntry, record: EntryRecord) -> None:
        """Queue the entry's file; ValueError when the entry does not match its record."""
        self.writer.write(capture(entry, record, self.fingerprint))

    def delete(self, entry_id: int) -> None:
        self.writer.delete(entry_id)

    def load(self, entry_id: int) -> StoredEntry | None:
        """The entry from its queued write or its file; None (logged) when missing or damaged."""
        job = self.writer.held(entry_id)
        if job is not None:
            held = job.entry
            return StoredEntry(held.layers, held.length, dict(held.states))
        path = disk.entry_path(self.directory, entry_id)
        t0 = time.perf_counter()
        try:
            entry, nbytes = load_entry(path, self.fingerprint, entry_id)
        except FileNotFoundError:
            log.warning("disk tier: file of entry %d is missing; prefilling cold", entry_id)
        except (disk.DamagedFile, OSError) as e:
            log.error(
                "disk tier: %s is damaged (%s); not loaded, renamed to %s",
                path,
                e,
                disk.DAMAGED_SUFFIX,
            )
            try:
                os.replace(path, path.with_suffix(disk.DAMAGED_SUFFIX))
            except OSError:
                pass
        else:
            self.loads += 1
            self.load_bytes += nbytes
            self.load_seconds += time.perf_counter() - t0
            try:
                os.utime(path)  # the disk tier's LRU survives restarts through mtimes
            except OSError:
                pass
            return entry
        self.load_failures += 1
        return None

    def flush(self, timeout: float | None = None) -> bool:
        return self.writer.flush(timeout)

    def close(self, timeout: float | None = None) -> bool:
        return self.writer.close(timeout)

    def stats(self) -> dict:
        queued, queued_bytes = self.writer.backlog
        return {
            "writer": self.writer.stats.as_dict(),
            "queued": queued,
            "queued_bytes": queued_bytes,
            "loads": self.loads,
            "load_failures": self.load_failures,
            "load_mb_per_s": self.load_bytes / self.load_seconds / 1e6
            if self.load_seconds
            else 0.0,
        }


# --- entries <-> files ------------------------------------------------------------

# The snapshot module's stored forms a file may hold, by name.
_FORMS = {
    cls.__name__: cls
    for cls in (
        snapshot.StoredKV,
        snapshot.StoredList,
        snapshot.ArraysState,
        snapshot.WindowState,
        snapshot.OpaqueState,
        snapshot.ListState,
        snapshot.StateSnapshot,
    )
}


def _dtype_name(a: mx.array) -> str:
    return str(a.dtype).rsplit(".", 1)[-1]


class _Encoder:
    """A stored form as JSON-able structure; arrays replaced by their index in `arrays`."""

    def __init__(self) -> None:
        self.arrays: list[tuple[mx.array, int | None]] = []  # (array, rows to keep)

    def tree(self, obj: Any, rows: int | None = None) -> Any:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, mx.array):
            self.arrays.append((obj, rows))
            return {"a": len(self.arrays) - 1}
        if isinstance(obj, tuple):
            return {"t": [self.tree(x, rows) for x in obj]}
        if isinstance(obj, list):
            return [self.tree(x, rows) for x in obj]
        if isinstance(obj, dict):
            return {"d": [[self.tree(k), self.tree(v, rows)] for k, v in obj.items()]}
        if isinstance(obj, type):
            return {"c": f"{obj.__module__}:{obj.__qualname__}"}
        name = type(obj).__name__
        if _FORMS.get(name) is not type(obj):
            raise ValueError(f"the disk tier cannot write a {name}")
        if isinstance(obj, snapshot.StoredKV):  # rows [:rows] of the shared buffers
            n = obj.length if rows is None else min(obj.length, rows)
            fields = {
                "keys": self.tree(obj.keys, n),
                "values": self.tree(obj.values, n),
                "length": n,
                "quant": self.tree(obj.quant),
            }
        else:
            fields = {
                f.name: self.tree(getattr(obj, f.name), rows) for f in dataclasses.fields(obj)
            }
        return {"o": name, "f": fields}


def capture(entry: StoredEntry, record: EntryRecord, fingerprint: str) -> disk.WriteJob:
    """The entry as a write job: numpy views over its arrays (bfloat16 as uint16 bits).

    Runs on the loop thread and copies nothing. ValueError when the entry does
    not hold the record's length or a state at each of its lengths.
    """
    length = len(record.tokens)
    lengths = sorted({n for n, _ in record.checkpoints} | {length})
    if entry.length != length or any(n not in entry.states for n in lengths):
        raise ValueError(
            f"entry {record.entry_id} holds {entry.length} tokens and states at "
            f"{sorted(entry.states)}; its record says {length} and {lengths}"
        )
    states = {n: entry.states[n] for n in lengths}
    enc = _Encoder()
    layers = enc.tree(list(entry.layers), rows=length)
    state_tree = [[n, enc.tree(states[n])] for n in lengths]
    bits = [a.view(mx.uint16) if a.dtype == mx.bfloat16 else a for a, _ in enc.arrays]
    mx.eval(bits)  # views share the buffers: no copy
    views, dtypes = [], []
    for (a, rows), b in zip(enc.arrays, bits):
        view = np.asarray(b)  # zero-copy over the evaluated buffer
        if rows is not None and view.ndim >= 2:
            view = view[..., :rows, :]
        views.append(view)
        dtypes.append(_dtype_name(a))
    meta = {
        "fingerprint": fingerprint,
        "entry_id": record.entry_id,
        "namespace": record.namespace,
        "role": record.role,
        "length": length,
        "prompt_len": record.prompt_len,
        "checkpoints": [list(c) for c in record.checkpoints],
        "kv_bytes_per_token": record.kv_bytes_per_token,
        "state_bytes": record.state_bytes,
        "created": time.time(),
        "layers": layers,
        "states": state_tree,
    }
    held = StoredEntry(entry.layers, length, states)
    return disk.WriteJob(
        record.entry_id,
        meta,
        np.asarray(record.tokens, np.int32),
        views,
        dtypes,
        held,
        sum(int(v.nbytes) for v in views),
    )


def _class(path: str) -> type:
    module, _, qualname = path.partition(":")
    if not module.startswith("mlx_lm."):
        raise disk.DamagedFile(f"refusing to build class {path}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _decode(node: Any, arrays: list) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(x, arrays) for x in node]
    if "a" in node:
        return arrays[node["a"]]
    if "t" in node:
        return tuple(_decode(x, arrays) for x in node["t"])
    if "d" in node:
        return {_decode(k, arrays): _decode(v, arrays) for k, v in node["d"]}
    if "c" in node:
        return _class(node["c"])
    form = _FORMS[node["o"]]
    return form(**{k: _decode(v, arrays) for k, v in node["f"].items()})


def load_entry(path: Path, fingerprint: str, entry_id: int) -> tuple[StoredEntry, int]:
    """(entry, file bytes) of one file, every check passed; DamagedFile (or OSError) if not."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = np.empty(size, np.uint8)
        if f.readinto(memoryview(buf)) != size:
            raise disk.DamagedFile("short read")
    header = disk.parse_header(buf.data, size)
    if header.fingerprint != fingerprint or header.entry_id != entry_id:
        raise disk.DamagedFile(
            f"file of entry {header.entry_id}, fingerprint "
            f"{header.fingerprint}; expected {entry_id}, {fingerprint}"
        )
    meta = header.meta
    body_bytes = int(meta["body_bytes"])
    body = buf[header.body_offset : header.body_offset + body_bytes]
    magic, declared, crc = disk._TRAILER.unpack_from(buf, header.body_offset + body_bytes)
    if magic != disk.END_MAGIC or declared != body_bytes:
        raise disk.DamagedFile("bad trailer")
    if zlib.crc32(body) != crc:
        raise disk.DamagedFile("body checksum mismatch")
    try:
        arrays = []
        for dtype, shape, offset, nbytes in meta["arrays"]:
            raw = np.dtype(np.uint16 if dtype == "bfloat16" else dtype)
            count = int(np.prod(shape, dtype=np.int64))
            if count * raw.itemsize != nbytes or offset + nbytes > body_bytes:
                raise disk.DamagedFile("array table out of bounds")
            view = np.frombuffer(body, raw, count, offset).reshape(shape)
            a = mx.array(view)
            arrays.append(a.view(mx.bfloat16) if dtype == "bfloat16" else a)
        layers = _decode(meta["layers"], arrays)
        states = {int(n): _decode(tree, arrays) for n, tree in meta["states"]}
    except (KeyError, TypeError, ValueError, AttributeError, ImportError) as e:
        raise disk.DamagedFile(f"undecodable body: {e}") from None
    if (
        set(states) != {n for n, _ in header.checkpoints} | {header.length}
        or not all(isinstance(s, snapshot.StateSnapshot) for s in states.values())
        or snapshot.entry_length(layers) not in (None, header.length)
    ):
        raise disk.DamagedFile("states do not match the header")
    mx.eval(arrays)
    return StoredEntry(layers, header.length, states), size
