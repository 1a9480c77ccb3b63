"""The cache contract over mlx-lm's layer caches: state snapshots, stored entries, restores.

The contract (docs/architecture.md, "The cache contract"):

- Append-only layers (``KVCache``, ``QuantizedKVCache``, ``BatchKVCache`` and
  such parts of a ``CacheList``): rows ``[:n]`` of a longer cache are the cache
  at ``n`` tokens. An entry keeps a finished sequence's extracted arrays as
  they are (new array objects over the same buffers: no copy), and a restore
  hands out views ``keys[..., :n, :]`` of them (no copy).
- State layers (``ArraysCache``, ``RotatingKVCache``, ``BatchRotatingKVCache``
  and every kind this package does not know, subclasses included): they cannot
  be cut back to an earlier token. A snapshot copies their arrays (small, and
  independent of the prompt length) and evaluates them, so it pins neither a
  batch buffer nor a lazy graph. Unknown kinds are copied whole.
- Why sharing is safe: MLX arrays are immutable once evaluated; a cache's
  in-place slice update is copy-on-write while another array object shares the
  buffer, and ``KVCache.update_and_fetch`` concatenates when its buffer is
  full. Every restored cache holds array objects of its own, so its writes
  never reach the entry or the snapshot, and nothing written to the cache an
  entry came from reaches the entry.
- The one KV copy of a warm turn is the batch merge (engine.runtime.batching),
  outside this package; ``CopyCounter`` records what this package copies and
  shares.
- Segments: an entry that reads its first rows from another holds only the rows
  after them (``split_rows`` copies those into buffers of their own); a restore takes
  views of each segment (``restore(..., prefix=)``) and the merge writes each in
  place; ``join_rows`` makes one buffer of them where one is needed (a file, a
  peer, an entry whose prefix entry leaves). ``pack_rows`` keeps stored rows
  quantized; a restore dequantizes them lazily.

Its parts: `forms` (the layer kinds, the stored forms and their byte figures),
`capture` (snapshots and stored entries taken from live caches), `restore` (fresh
caches over them) and `rows` (an entry's rows packed, split and joined).

Its one way in: the names below (`from engine.runtime import layer_caches`); the
parts import only `forms` and `rows` of each other.

It must not import anything of the engine (tests/test_layering.py): it knows mlx-lm's
cache classes and MLX arrays, and nothing about tokens, lineages, budgets, or when a
snapshot should be taken.
"""

from engine.runtime.layer_caches.capture import snapshot_state, snapshot_state_single, store_entry
from engine.runtime.layer_caches.forms import (
    APPEND,
    LIST,
    STATE,
    ArraysState,
    CopyCounter,
    EntryLayer,
    LayerState,
    ListState,
    OpaqueState,
    StateSnapshot,
    StoredKV,
    StoredList,
    WindowState,
    arrays_of,
    entry_length,
    kv_bytes_per_token,
    layer_kind,
    nbytes,
)
from engine.runtime.layer_caches.restore import restore
from engine.runtime.layer_caches.rows import join_rows, pack_rows, split_rows

__all__ = [
    "APPEND",
    "LIST",
    "STATE",
    "ArraysState",
    "CopyCounter",
    "EntryLayer",
    "LayerState",
    "ListState",
    "OpaqueState",
    "StateSnapshot",
    "StoredKV",
    "StoredList",
    "WindowState",
    "arrays_of",
    "entry_length",
    "join_rows",
    "kv_bytes_per_token",
    "layer_kind",
    "nbytes",
    "pack_rows",
    "restore",
    "snapshot_state",
    "snapshot_state_single",
    "split_rows",
    "store_entry",
]
