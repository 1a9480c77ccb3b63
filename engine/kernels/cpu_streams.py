"""Streams the kernels spread independent pieces of work over, on the CPU.

MLX runs each stream on a thread of its own and its CPU matmul (BLAS) on one
core, so pieces of a computation placed on different streams run side by
side: on this project's 2-core CPU, two streams run the decode shape's
batched matmuls 1.7x faster than one. Off the CPU (Metal, CUDA) the device
already runs a kernel across its cores, so there is one stream: the current
one. Streams belong to the thread that made them, so each thread gets its
own (the model loop's thread, a test's thread).

A thread that used MLX ends with `release_thread()`: MLX keeps per-thread
state (its streams, the cache of `mx.compile`d functions, which holds Python
objects) and drops it in the thread's C++ exit handlers, which take the GIL.
A thread that ends while the interpreter finalizes is stopped by Python inside
such a handler, and the process aborts ("terminate called without an active
exception"); released beforehand, there is nothing left to drop.

This module knows MLX streams; it knows nothing of the models.
"""

from __future__ import annotations

import contextlib
import os
import threading

import mlx.core as mx

# At most this many streams; fewer on a machine with fewer cores.
MAX_STREAMS = 4
_LOCAL = threading.local()


def streams() -> list:
    """This thread's CPU streams, or [None] (the current stream) off the CPU or on one core."""
    if mx.default_device().type != mx.cpu:
        return [None]
    mine = getattr(_LOCAL, "streams", None)
    if mine is None:
        count = min(MAX_STREAMS, os.cpu_count() or 1)
        mine = [mx.new_stream(mx.cpu) for _ in range(count)] if count > 1 else [None]
        _LOCAL.streams = mine
    return mine


def on(stream):
    """`with on(stream):` places the ops built inside on `stream` (None: the current one)."""
    return mx.stream(stream) if stream is not None else contextlib.nullcontext()


def release_thread() -> None:
    """Drop this thread's MLX state now (its streams, its compiled functions), with the
    interpreter whole: the last MLX call of a thread that ends (module doc)."""
    _LOCAL.__dict__.pop("streams", None)
    mx.clear_streams()
