"""The model loop: one thread that owns the Generator and runs every MLX call.

Everything that touches the model, the batch or the RAM tier runs on this
thread, so none of it locks; the one exception is a prefill chunk's forward
under `--prefill-overlap on`, which runs on the batch generator's
PrefillWorker thread on a prompt batch nothing else touches until it ends
(engine.runtime.batching.chunked). Other threads (the Ray actor's event loop, a
test) reach the Generator only through the inbox: `call(fn)` queues
`fn(generator)`; `ask(fn)` also waits for its result. Between requests the
loop sleeps on the inbox; after `idle_release_s` without work it releases
MLX's buffer pool once and gives malloc's free pages back (engine.runtime.malloc:
glibc only), so an idle server holds what it uses, not what its last burst
freed; a request that arrives during that release waits for it (tens of ms where
the burst freed tens of MiB). A step that raises fails the batch's requests (each
gets an error Finished) and the loop goes on with a fresh batch.

It knows nothing about Ray, gRPC or the cache manager: the Generator's
CacheLink is built by whoever builds the Generator.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, TypeVar

from engine.runtime import malloc
from engine.runtime.generator import Generator

log = logging.getLogger(__name__)
IDLE_RELEASE_S = 2.0  # release MLX's buffer pool after this long without work
T = TypeVar("T")


class ModelLoop:
    """A Generator on a thread of its own, reached through an inbox of callables."""

    def __init__(
        self,
        build: Callable[[], Generator],
        idle_release_s: float = IDLE_RELEASE_S,
        flush: Callable[[], None] = lambda: None,
    ):
        """Start the thread and build the Generator on it; re-raises what `build` raised.

        `flush` runs on the loop thread after every step and after every batch of inbox
        calls: the events emitted meanwhile leave together (one hand-off per step, not
        one per token)."""
        self.idle_release_s = idle_release_s
        self.flush = flush
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.generator: Generator | None = None
        self.pool_releases = 0
        self.trimmer = malloc.Trimmer(0)  # trimmed by hand at each idle release, no thread
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._stopped = False
        self.thread = threading.Thread(target=self._run, args=(build,), name="model-loop")
        self.thread.daemon = True
        self.thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def call(self, fn: Callable[[Generator], object]) -> None:
        """Run `fn(generator)` on the loop thread, before its next step."""
        self.inbox.put(fn)

    def ask(self, fn: Callable[[Generator], T], timeout: float = 30.0) -> T:
        """Run `fn(generator)` on the loop thread and return its result (or raise its error)."""
        done: queue.SimpleQueue = queue.SimpleQueue()

        def run(g: Generator) -> None:
            try:
                done.put((True, fn(g)))
            except Exception as e:
                done.put((False, e))

        self.inbox.put(run)
        ok, value = done.get(timeout=timeout)
        if not ok:
            raise value
        return value

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread after the calls queued so far (requests in the batch stay unfinished)."""
        self._stopped = True
        self.inbox.put(lambda g: None)
        self.thread.join(timeout)
        if self.generator is not None and not self.thread.is_alive():
            self.generator.close()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    # ---- the thread ------------------------------------------------------------

    def _run(self, build: Callable[[], Generator]) -> None:
        from engine.kernels.cpu_streams import release_thread

        try:
            self._serve(build)
        finally:  # the thread's MLX state, dropped while the interpreter is whole
            release_thread()

    def _serve(self, build: Callable[[], Generator]) -> None:
        try:
            self.generator = build()
        except BaseException as e:  # re-raised by __init__
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        gen = self.generator
        gen.wake = lambda: self.inbox.put(lambda g: None)  # a disk read ended: step again
        idle_since: float | None = None
        while not self._stopped:
            self._drain(block=not gen.busy)
            self._flush()
            if not gen.busy:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > self.idle_release_s:
                    self._release_pool()
                    idle_since = float("inf")  # once per idle spell
                continue
            idle_since = None
            try:
                gen.step()
            except Exception as e:  # a failed batch must not take the server down
                log.exception("batch step failed")
                gen.fail_all(f"{type(e).__name__}: {e}")
            self._flush()

    def _flush(self) -> None:
        try:
            self.flush()
        except Exception:  # the events' way out failed: the loop still runs
            log.exception("flushing the step's events failed")

    def _drain(self, block: bool) -> None:
        """Run the queued calls: wait briefly for the first when `block`, then all that came."""
        try:
            fn = self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                fn(self.generator)
            except Exception:
                log.exception("model loop call failed")
            try:
                fn = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _release_pool(self) -> None:
        import mlx.core as mx

        mx.clear_cache()
        self.pool_releases += 1
        self.trimmer.trim()

    @property
    def malloc_trims(self) -> int:
        """Idle spells whose free malloc pages went back (0 where malloc is not glibc's)."""
        return self.trimmer.trims

    @property
    def malloc_returned(self) -> int:
        """The resident bytes those trims gave back."""
        return self.trimmer.returned
