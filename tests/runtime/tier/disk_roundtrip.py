"""A RAM-tier entry written through a real DiskStore and read back (for the tests of
what survives the disk tier)."""

from __future__ import annotations

import numpy as np

from engine.cache.kinds import Role
from engine.cache.messages import EntryRecord
from engine.runtime import layer_caches
from engine.storage.disk_store import DiskStore


def write_and_load(engine, entry_id: int, namespace: str, prompt_len: int, directory):
    """Entry `entry_id` of `engine`'s tier as its file gives it back (None: it did not)."""
    entry = engine.tier.entries[entry_id]
    record = EntryRecord(
        entry_id,
        namespace,
        Role.CONVERSATION,
        np.asarray(entry.tokens[: entry.length], np.int32),
        prompt_len,
        tuple((n, "reply") for n in sorted(entry.states) if n != entry.length),
        layer_caches.kv_bytes_per_token(entry.layers),
        entry.states[entry.length].nbytes,
    )
    store = DiskStore(directory, engine.info.fingerprint)
    try:
        store.write(entry, record)
        assert store.flush(30)
        return store.load(entry_id, namespace)
    finally:
        store.close(30)
