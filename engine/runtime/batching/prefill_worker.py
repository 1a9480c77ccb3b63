"""A prefill chunk's forward on a thread of its own, beside the model loop's decode.

On the CPU a step that runs a chunk after the decode forward costs the two
forwards one after the other: at least two idle decode steps, whatever the
chunk's size (docs/benchmarks.md, "What bounds the two targets not met").
Here the chunk's forward runs on a worker thread, on an MLX stream of that
thread, while the model loop goes on decoding: MLX evaluates with the GIL
released and the host attention kernel's BLAS and numpy release it too, so
the two forwards share the cores instead of queueing.

What keeps the decode steps fast beside it is how the worker evaluates
(`module_eval`, `--prefill-eval`). MLX's `eval` throttles every stream on
one process-wide count: while more than 10 tasks (of 10 dispatched arrays
each) are in flight on any stream, scheduling each further array first waits
for some task to end. A chunk's forward evaluated whole keeps that count at
its ceiling for as long as it runs, so a decode step's eval waited for one
of the worker's tasks per array it scheduled: 1.6 ms decode forwards took
15-21 ms (docs/benchmarks.md, "`--prefill-eval`: a long prefill evaluated
module by module"). With `module_eval` the worker evaluates each module's
output as a long prefill's forward goes (every module class of the model but
the model's own, whose output is logits no chunk reads, has its `__call__`
wrapped once, process-wide; the wrapper evaluates only on a
worker thread that asked for it, and does nothing elsewhere), so its queue
stays a few tasks deep and the decode's arrays are scheduled without
waiting. That costs the worker its pipelining (the next module's graph is
built after the last one ran): the caller asks for it per chunk
(`by_module`), for the chunks longer than the streams' gap budget, which are
background work beside decoding streams (prefill_policy's `Chunk.background`),
and not for one within it, which the streams may wait for whole, nor for a short
turn run whole, whose first token is the wait that matters. It is the default
on the CPU device, where each eval is a thread hand-off; on a GPU each would be
a command buffer, so whole forwards.

What makes it safe is what the two threads touch: the worker runs one
prompt batch's `forward` (that batch's caches and token lists, and the
model's weights, read only); the loop thread leaves that batch alone until
`wait` has returned (its owner, ChunkedBatchGenerator, waits before any read
or change of it), and does the accounting (ledger, counters) itself.

It knows a thread and an MLX stream; the batch and the order are the caller's.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor

import mlx.core as mx

from engine.kernels.cpu_streams import release_thread

# A worker thread's own flag: `module_eval` is set on the thread that evaluates module by module.
_THREAD = threading.local()
# Module outputs evaluated by a worker as its forward went, since import: the tests read it.
EVALUATED: Counter = Counter()


def _evaluating(call):
    """A module class's `__call__` that evaluates its output on a thread that asked for it."""

    @functools.wraps(call)
    def evaluating_call(self, *args, **kwargs):
        out = call(self, *args, **kwargs)
        if getattr(_THREAD, "module_eval", False) and isinstance(out, (mx.array, tuple, list)):
            mx.eval(out)
            EVALUATED[type(self).__name__] += 1
        return out

    evaluating_call.evaluating = True
    return evaluating_call


def install_module_eval(model) -> int:
    """Wrap the `__call__` of every module class in `model` (once per class); how many now.

    Process-wide, like any patch of a class, and inert off a worker thread that
    set `module_eval`: the wrapper then only reads a thread-local flag.
    """
    wrapped = 0
    # Not the model's own class: its output is every position's logits, which a prefill
    # chunk never reads (only its caches' state is evaluated), at the price of the LM head.
    for cls in {type(m) for m in model.modules()} - {type(model)}:
        owner = next((c for c in cls.__mro__ if "__call__" in vars(c)), None)
        if owner is None or owner in (object, dict):
            continue  # a container module with no forward of its own
        if not getattr(owner.__call__, "evaluating", False):
            owner.__call__ = _evaluating(owner.__call__)
            wrapped += 1
    return wrapped


def module_eval_default() -> bool:
    """`--prefill-eval auto`: module by module on the CPU device, whole forwards elsewhere."""
    return mx.default_device() == mx.cpu


def _worker_stream():
    return mx.new_stream(mx.default_device())


class PrefillWorker:
    """One thread that runs one prompt batch's forward at a time (module doc)."""

    def __init__(self, model=None, module_eval: bool = False):
        if module_eval:
            if model is None:
                raise ValueError("module_eval needs the model whose modules it evaluates")
            install_module_eval(model)
        self.module_eval = module_eval
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prefill-worker")
        # A stream belongs to the thread that made it: make it there.
        self._stream = self._pool.submit(_worker_stream).result()
        self._flight: Future | None = None
        self._closed = False

    def start(self, batch, prompts: list, by_module: bool = True) -> None:
        """Run `batch.forward(prompts)` on the worker; one at a time. With `module_eval`,
        `by_module` chooses for this chunk: module by module, or the forward whole."""
        assert self._flight is None, "a chunk is already in flight"
        self._flight = self._pool.submit(self._run, batch, prompts, by_module)

    def _run(self, batch, prompts: list, by_module: bool) -> float:
        _THREAD.module_eval = self.module_eval and by_module
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

    def close(self, wait: bool = True, release: bool = True) -> None:
        """End the thread once the chunk in flight ends; with `wait`, wait for that here.
        With `release`, its last task drops its MLX state
        (engine.kernels.cpu_streams.release_thread). A finalizer passes False: the collector
        may run it inside another executor's `submit`, which holds the lock a second
        `submit` takes (a deadlock on one thread)."""
        if not self._closed:
            self._closed = True
            if release:
                try:
                    self._pool.submit(release_thread)
                except RuntimeError:  # the interpreter is exiting: its threads are joined
                    pass
        self._pool.shutdown(wait=wait)
