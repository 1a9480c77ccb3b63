"""Engine configurations the tests serve: the embedded tiny model, small budgets, port 0."""

from __future__ import annotations

import itertools

from engine.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig

# Engines of one test session share its Ray: each names its actors in a namespace of its own.
_ENGINES = itertools.count()


def make_config(cache_dir, **cache):
    return EngineConfig(
        model=ModelConfig(max_batch=8, prefill_step_size=256),
        # A fixed guard threshold: the measured one (the default) varies with the load.
        cache=CacheConfig(
            cache_dir=str(cache_dir), ram_budget=2 << 30, **{"guard_min_suffix": 256, **cache}
        ),
        server=ServerConfig(port=0, ray_namespace=f"lineage-tests-{next(_ENGINES)}"),
    )
