"""Engine configurations the tests serve: the embedded tiny model, small budgets, port 0."""

from __future__ import annotations

from engine.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig


def make_config(cache_dir, **cache):
    return EngineConfig(
        model=ModelConfig(max_batch=8, prefill_step_size=256),
        cache=CacheConfig(cache_dir=str(cache_dir), ram_budget=2 << 30, **cache),
        server=ServerConfig(port=0),
    )
