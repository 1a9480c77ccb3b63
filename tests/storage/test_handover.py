"""A RAM-tier entry handed over to another replica (engine.storage.handover), without Ray.

Every stored form goes to numpy views and back into MLX bit-identical: the rows
within the entry's length, each state snapshot, the prompt end's logits.
"""

from __future__ import annotations

import pickle

import mlx.core as mx
import pytest

from engine.storage.handover import from_portable, to_portable
from tests.storage.test_disk_files import LAYOUTS, _assert_same, _entry, _restored


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_an_entry_handed_over_restores_bit_identical(layout):
    entry = _entry(layout, n=30)
    entry.logits[30] = mx.arange(8, dtype=mx.float32)
    portable = pickle.loads(pickle.dumps(to_portable(entry)))  # what Ray's object store does
    assert portable.nbytes > 0 and portable.exported_at > 0
    back = from_portable(portable)
    assert back.length == 30 and set(back.states) == {30}
    _assert_same(_restored(back, 30), _restored(entry, 30))
    assert mx.array_equal(back.logits[30], entry.logits[30]).item()


def test_only_the_rows_within_the_entry_length_move():
    entry = _entry("hybrid-float32", n=30)
    shorter = type(entry)(entry.layers, 20, {20: entry.states[30]})
    assert to_portable(shorter).nbytes < to_portable(entry).nbytes
