"""Stored entries to file contents and back: the only code that sees both MLX and files.

`to_write_job` turns a RAM-tier entry into a WriteJob (numpy views over its
evaluated arrays, no copy); `read_entry` turns a file back into a StoredEntry
after every check (header, trailer, body checksum, structure). The structure
is written as JSON naming the stored forms of engine.runtime.layer_caches;
a file may name only those forms and the cache classes of
`mlx_lm.models.cache` (CACHE_CLASSES). A load checks that the file holds the
namespace and tokens its plan expects, not just its id and fingerprint.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from engine.cache.messages import EntryRecord
from engine.runtime import layer_caches, packed_state
from engine.runtime.tier.ram import StoredEntry
from engine.storage import file_format
from engine.storage.writer import WriteJob

# The stored forms (engine.runtime.layer_caches) a file may hold, by name.
_FORMS = {
    cls.__name__: cls
    for cls in (
        layer_caches.StoredKV,
        layer_caches.StoredList,
        layer_caches.ArraysState,
        layer_caches.WindowState,
        layer_caches.OpaqueState,
        layer_caches.ListState,
        layer_caches.StateSnapshot,
        packed_state.PackedArray,
    )
}


def dtype_name(a: mx.array) -> str:
    return str(a.dtype).rsplit(".", 1)[-1]


class Encoder:
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
        if isinstance(obj, layer_caches.StoredKV):  # rows [:rows] of the shared buffers
            n = obj.length if rows is None else min(obj.length, rows)
            fields = {
                "keys": self.tree(obj.keys, n),
                "values": self.tree(obj.values, n),
                "length": n,
                "quant": self.tree(obj.quant),
                "packed": self.tree(obj.packed),
            }
        else:
            fields = {
                f.name: self.tree(getattr(obj, f.name), rows) for f in dataclasses.fields(obj)
            }
        return {"o": name, "f": fields}


def to_write_job(entry: StoredEntry, record: EntryRecord, fingerprint: str) -> WriteJob:
    """The entry as a write job: numpy views over its arrays (bfloat16 as uint16 bits).

    Runs on the loop thread and copies nothing. ValueError when the entry does
    not hold the record's length or a state at each of its lengths, or was
    computed on other tokens than the record's (a file that passes every check
    must never carry another prompt's rows).
    """
    length = len(record.tokens)
    lengths = sorted({n for n, _ in record.checkpoints} | {length})
    if entry.length != length or any(n not in entry.states for n in lengths):
        raise ValueError(
            f"entry {record.entry_id} holds {entry.length} tokens and states at "
            f"{sorted(entry.states)}; its record says {length} and {lengths}"
        )
    if entry.tokens is not None and not np.array_equal(entry.tokens[:length], record.tokens):
        raise ValueError(f"entry {record.entry_id} holds other tokens than its record's")
    states = {n: entry.states[n] for n in lengths}
    enc = Encoder()
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
        dtypes.append(dtype_name(a))
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
    tokens = np.asarray(record.tokens, np.int32)
    held = StoredEntry(entry.layers, length, states, tokens=tokens)
    return WriteJob(
        record.entry_id,
        meta,
        tokens,
        views,
        dtypes,
        held,
        sum(int(v.nbytes) for v in views),
        tuple(record.supersedes),
    )


def _cache_classes() -> dict[str, type]:
    from mlx_lm.models import cache

    return {
        f"{cls.__module__}:{cls.__qualname__}": cls
        for cls in vars(cache).values()
        if isinstance(cls, type) and issubclass(cls, cache._BaseCache)
    }


# The only classes a file may name: mlx-lm's layer caches, by "module:qualname".
CACHE_CLASSES = _cache_classes()


def _class(path: str) -> type:
    cls = CACHE_CLASSES.get(path)
    if cls is None:
        raise file_format.DamagedFile(f"refusing to build class {path!r}: not an mlx-lm cache")
    return cls


def decode_tree(node: Any, arrays: list) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [decode_tree(x, arrays) for x in node]
    if "a" in node:
        return arrays[node["a"]]
    if "t" in node:
        return tuple(decode_tree(x, arrays) for x in node["t"])
    if "d" in node:
        return {decode_tree(k, arrays): decode_tree(v, arrays) for k, v in node["d"]}
    if "c" in node:
        return _class(node["c"])
    form = _FORMS[node["o"]]
    return form(**{k: decode_tree(v, arrays) for k, v in node["f"].items()})


def read_entry(
    path: Path,
    fingerprint: str,
    entry_id: int,
    namespace: str | None = None,
    tokens: np.ndarray | None = None,
) -> tuple[StoredEntry, int]:
    """(entry, file bytes) of one file, every check passed; DamagedFile (or OSError) if not.

    `namespace` and `tokens` (the prefix the plan restores) are what the file
    must hold; None skips that check.
    """
    return finish_entry(read_arrays(path, fingerprint, entry_id), namespace, tokens)


# The dtypes a file's arrays may have, by the names `dtype_name` writes.
_DTYPE_NAMES = "bool_ uint8 uint16 uint32 uint64 int8 int16 int32 int64 float16 float32 bfloat16"
_DTYPES = {name: getattr(mx, name) for name in _DTYPE_NAMES.split() if hasattr(mx, name)}


def read_arrays(path: Path, fingerprint: str, entry_id: int):
    """The part of a load a reader thread runs: the header, then the body read straight
    into MLX buffers allocated here (no copy after the read), checked (the array table,
    the trailer, the crc32) and evaluated. `finish_entry` ends it on the model's thread.

    Every step that touches the body's bytes (allocation, `readinto`, crc32) runs
    in C without the GIL: the model loop decodes meanwhile (bench restart).
    """
    return drain(read_steps(path, fingerprint, entry_id))


def read_steps(path: str | Path, fingerprint: str, entry_id: int, dir_fd: int | None = None):
    """`read_arrays` in steps (one array's allocation, one chunk of the body read): yields
    the bytes done so far after each (allocated, then read: twice the arrays' bytes at the
    end) and returns what `read_arrays` returns, so a reader
    can hand the rest of a load to another thread (`drain` there). Each step creates
    and evaluates its own arrays, so none is left on the stream of the thread that
    ran the steps before. With `dir_fd` (the directory as opened at start) the file
    is opened relative to it, whatever its path has become since. `path` is split as a
    string, not parsed into a `Path` (file_format.entry_name says why)."""
    directory, name = os.path.split(os.fspath(path))
    with file_format.open_entry(directory if dir_fd is None else dir_fd, name) as f:
        size = os.fstat(f.fileno()).st_size
        header = file_format.read_header_from(f, size)
        if header.fingerprint != fingerprint or header.entry_id != entry_id:
            raise file_format.DamagedFile(
                f"file of entry {header.entry_id}, fingerprint "
                f"{header.fingerprint}; expected {entry_id}, {fingerprint}"
            )
        try:
            table = []
            for dtype, shape, _, nbytes in header.meta["arrays"]:
                kind = _DTYPES[dtype]
                raw = mx.uint16 if kind == mx.bfloat16 else kind
                shape = [int(d) for d in shape]
                if any(d < 0 for d in shape) or int(np.prod(shape)) * raw.size != nbytes:
                    raise file_format.DamagedFile("array table out of bounds")
                table.append((shape, raw, nbytes))
        except (KeyError, TypeError, ValueError) as e:
            raise file_format.DamagedFile(f"undecodable body: {e}") from None
        if sum(nbytes for *_, nbytes in table) > size:  # before allocating them
            raise file_format.DamagedFile("array table out of bounds")
        buffers, done = [], 0
        for shape, raw, nbytes in table:
            buffers.append(mx.zeros(shape, raw))
            mx.eval(buffers[-1])  # a fresh buffer (a memset, without the GIL), nobody else's
            done += nbytes
            yield done
        # Writable numpy views over them: the file's bytes land in MLX's memory.
        for read in file_format.body_steps(f, header, [np.asarray(a) for a in buffers]):
            yield done + read
    arrays = [
        a.view(mx.bfloat16) if dtype == "bfloat16" else a
        for a, (dtype, *_) in zip(buffers, header.meta["arrays"])
    ]
    mx.eval(arrays)  # the bfloat16 views share their buffers
    return header, arrays, size


def drain(steps):
    """Run a step generator (`read_steps`) to its end; what it returns."""
    try:
        while True:
            next(steps)
    except StopIteration as stop:
        return stop.value


def finish_entry(
    read, namespace: str | None = None, tokens: np.ndarray | None = None
) -> tuple[StoredEntry, int]:
    """(entry, file bytes) from `read_arrays`: the stored forms rebuilt and evaluated.

    DamagedFile when the file does not hold `namespace` or start with `tokens`.
    """
    header, arrays, size = read
    if namespace is not None and header.namespace != namespace:
        raise file_format.DamagedFile("the file's namespace is not the plan's")
    if tokens is not None and (
        len(tokens) > header.length or not np.array_equal(header.tokens[: len(tokens)], tokens)
    ):
        raise file_format.DamagedFile("the file does not hold the planned tokens")
    meta = header.meta
    try:
        layers = decode_tree(meta["layers"], arrays)
        states = {int(n): decode_tree(tree, arrays) for n, tree in meta["states"]}
    except (KeyError, TypeError, ValueError, AttributeError, ImportError) as e:
        raise file_format.DamagedFile(f"undecodable body: {e}") from None
    if (
        set(states) != {n for n, _ in header.checkpoints} | {header.length}
        or not all(isinstance(s, layer_caches.StateSnapshot) for s in states.values())
        or layer_caches.entry_length(layers) not in (None, header.length)
    ):
        raise file_format.DamagedFile("states do not match the header")
    mx.eval(arrays)
    return StoredEntry(layers, header.length, states, tokens=header.tokens), size
