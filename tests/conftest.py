"""Session-wide fixtures: one Ray instance, real engines served on localhost ports.

An engine runs its grpc.aio server on an event loop in a background thread, so
the tests talk to it with ordinary (sync) gRPC clients, as users do.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


class EngineThread:
    """A running engine (actors + gRPC server) driven from a background event loop."""

    def __init__(self, config, timeout: float = 300):
        from engine.serve import start_engine

        self.config = config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.engine = self.call(start_engine(config, port=0), timeout)
        self.address = self.engine.address

    def call(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        try:
            self.call(self.engine.stop(grace=1.0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def tier_stats(self) -> dict:
        import ray

        return ray.get(self.engine.model.tier_stats.remote(), timeout=60)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=False,
        namespace="lineage-tests",
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory):
    """Where the embedded default model is built, once per session."""
    return tmp_path_factory.mktemp("lineage-cache")


def make_config(cache_dir, **cache):
    from engine.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig

    return EngineConfig(
        model=ModelConfig(max_batch=8, prefill_step_size=256),
        cache=CacheConfig(cache_dir=str(cache_dir), ram_budget=2 << 30, **cache),
        server=ServerConfig(port=0),
    )


@pytest.fixture(scope="session")
def engine(ray_session, model_cache_dir):
    """The embedded default model in lineage mode, shared by the session."""
    e = EngineThread(make_config(model_cache_dir))
    yield e
    e.stop()


@pytest.fixture(scope="session")
def stub(engine):
    import grpc

    from engine.proto import engine_pb2_grpc

    channel = grpc.insecure_channel(engine.address)
    yield engine_pb2_grpc.EngineStub(channel)
    channel.close()
