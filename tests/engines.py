"""Engine configurations the tests serve: small budgets, port 0, and the embedded default
model unless `model` names a model directory (the random-weight qwen3_next of
tests/conftest.py `random_model_dir`, for tests that need no trained predictions)."""

from __future__ import annotations

import itertools

from engine.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig

# Engines of one test session share its Ray: each names its actors in a namespace of its own.
_ENGINES = itertools.count()


def make_config(cache_dir, model=None, **cache):
    return EngineConfig(
        model=ModelConfig(
            path=None if model is None else str(model), max_batch=8, prefill_step_size=256
        ),
        # A fixed guard threshold: the measured one (the default) varies with the load.
        cache=CacheConfig(
            cache_dir=str(cache_dir), ram_budget=2 << 30, **{"guard_min_suffix": 256, **cache}
        ),
        server=ServerConfig(port=0, ray_namespace=f"lineage-tests-{next(_ENGINES)}"),
    )
