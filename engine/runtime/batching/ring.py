"""A ring of fixed-size records: the newest `keep` of them, in one preallocated numpy array.

A log kept for the life of a process (the step profile, the prefill log) costs its full
size from its first record: the array is allocated and written through at construction,
so its pages are resident from the start and appending allocates nothing of its own
(an `object` field keeps the caller's object alive until its record is overwritten:
that part still fills, until the ring first wraps). A growing deque of objects
instead fills for as long as it takes to reach its bound (minutes at a serving rate),
all of it, which a memory slope reads as growth.

It knows numpy structured dtypes and nothing of what the records mean; string fields
are `object` fields, holding the caller's own objects.
"""

from __future__ import annotations

import numpy as np


class Ring:
    """The newest `keep` records of `dtype`, oldest first when read."""

    def __init__(self, dtype: np.dtype | list, keep: int):
        if keep < 1:
            raise ValueError(f"a ring keeps at least one record, not {keep}")
        self.dtype = np.dtype(dtype)
        self.keep = keep
        self.written = 0  # records appended in all
        self._data = np.empty(keep, self.dtype)
        self._data[...] = np.zeros((), self.dtype)  # every page touched now, not as rows come

    def __len__(self) -> int:
        return min(self.written, self.keep)

    def append(self, record: tuple) -> None:
        """Keep `record` (one value per field, in the dtype's order), over the oldest if full."""
        self._data[self.written % self.keep] = record
        self.written += 1

    def ordered(self) -> np.ndarray:
        """The records kept, oldest first (a view until the ring wraps, then a copy)."""
        if self.written <= self.keep:
            return self._data[: self.written]
        head = self.written % self.keep
        return np.concatenate((self._data[head:], self._data[:head]))
