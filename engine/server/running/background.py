"""A running engine (actors plus gRPC server) on an event loop of its own thread.

For callers that are not asyncio themselves (tests, benchmarks, the bridge's
tests): `BackgroundEngine(config)` serves on a free localhost port, so they
talk to it with ordinary gRPC clients as users do, and `stop()` shuts it down
cleanly. `BackgroundLoop` is the bare event-loop thread beneath it, for
anything else that must run on a loop (the HTTP bridge in tests). Ray must
already be initialized.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Awaitable, TypeVar

from engine.config import EngineConfig

T = TypeVar("T")


class BackgroundLoop:
    """An asyncio event loop running forever on a daemon thread."""

    def __init__(self, name: str = "background-loop"):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def call(self, coro: Awaitable[T], timeout: float = 120) -> T:
        """Run `coro` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class BackgroundEngine:
    """`start_engine(config)` on a BackgroundLoop; `address` is where it serves gRPC."""

    def __init__(self, config: EngineConfig, timeout: float = 300, local_socket: str | None = None):
        from engine.server.running.serve import start_engine

        self.config = config
        self.background = BackgroundLoop("engine-loop")
        try:
            start = start_engine(config, port=0, local_socket=local_socket)
            self.engine = self.background.call(start, timeout)
        except BaseException:
            self.background.close()
            raise
        self.address = self.engine.address

    def call(self, coro: Awaitable[T], timeout: float = 120) -> T:
        return self.background.call(coro, timeout)

    def generator_stats(self):
        """The model actor's GeneratorStats (RAM tier, batch, disk writer)."""
        import ray

        return ray.get(self.engine.model.generator_stats.remote(), timeout=60)

    def step_profile(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """The model loop's step times by phase between two `time.perf_counter` readings."""
        import ray

        return ray.get(self.engine.model.step_profile.remote(since, until), timeout=60)

    def prefill_log(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """The model loop's prefill log (engine.runtime.batching.prefill_log) between two
        `time.perf_counter` readings."""
        import ray

        return ray.get(self.engine.model.prefill_log.remote(since, until), timeout=60)

    def stop(self, grace: float = 1.0) -> None:
        try:
            self.call(self.engine.stop(grace=grace))
        finally:
            self.background.close()

    def __enter__(self) -> "BackgroundEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
