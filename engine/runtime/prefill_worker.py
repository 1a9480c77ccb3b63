"""A prefill chunk's forward on a thread of its own, beside the model loop's decode.

On the CPU a step that runs a chunk after the decode forward costs the two
forwards one after the other: at least two idle decode steps, whatever the
chunk's size (docs/benchmarks.md, "What bounds the two targets not met").
Here the chunk's forward runs on a worker thread, on an MLX stream of that
thread, while the model loop goes on decoding: MLX evaluates with the GIL
released and the host attention kernel's BLAS and numpy release it too, so
the two forwards share the cores instead of queueing.

What makes it safe is what the two threads touch: the worker runs one
prompt batch's `forward` (that batch's caches and token lists, and the
model's weights, read only); the loop thread leaves that batch alone until
`wait` has returned (its owner, ChunkedBatchGenerator, waits before any read
or change of it), and does the accounting (ledger, counters) itself.

It knows a thread and an MLX stream; the batch and the order are the caller's.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import mlx.core as mx


def _worker_stream():
    return mx.new_stream(mx.default_device())


class PrefillWorker:
    """One thread that runs one prompt batch's forward at a time (module doc)."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prefill-worker")
        # A stream belongs to the thread that made it: make it there.
        self._stream = self._pool.submit(_worker_stream).result()
        self._flight: Future | None = None

    def start(self, batch, prompts: list) -> None:
        """Run `batch.forward(prompts)` on the worker; one at a time."""
        assert self._flight is None, "a chunk is already in flight"
        self._flight = self._pool.submit(self._run, batch, prompts)

    def _run(self, batch, prompts: list) -> float:
        tic = time.perf_counter()
        with mx.stream(self._stream):
            batch.forward(prompts)
        return time.perf_counter() - tic

    @property
    def done(self) -> bool:
        """The chunk in flight has ended (`wait` would not block)."""
        return self._flight is not None and self._flight.done()

    def wait(self) -> float:
        """Wait for the chunk in flight; its forward's seconds (re-raises its error)."""
        assert self._flight is not None, "no chunk in flight"
        try:
            return self._flight.result()
        finally:
            self._flight = None

    def close(self) -> None:
        """Let the chunk in flight end, then end the thread."""
        self._pool.shutdown(wait=True)
