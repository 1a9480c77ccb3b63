"""Fixtures of the runtime tests that run the model loop without Ray, on a random-weight
qwen3_next (the embedded model is trained: held to a grammar at temperature 1 it writes
long calls; garbage is what tests the mask)."""

from __future__ import annotations

import pytest

from engine.cache.manager import CacheManager
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.generator import Generator
from engine.runtime.local import LocalLink
from engine.runtime.loop import ModelLoop
from engine.runtime.model.loader import load_model
from engine.runtime.tier.ram import RamTier


@pytest.fixture(scope="module")
def tiny_loaded(model_cache_dir, random_model_dir):
    config = EngineConfig(
        model=ModelConfig(path=str(random_model_dir), prefill_step_size=128),
        cache=CacheConfig(cache_dir=str(model_cache_dir), ram_budget=1 << 30),
    )
    return config, load_model(config)


def start_loop(config: EngineConfig, model, tokenizer, info) -> ModelLoop:
    """A model loop serving `model` under `config`, its cache manager in process
    (`loop.manager`); the caller stops it."""
    manager = CacheManager(config.cache, info.fingerprint, info.has_state_layers)

    def build() -> Generator:
        return Generator(
            model, tokenizer, config, RamTier(info.has_state_layers), LocalLink(manager)
        )

    loop = ModelLoop(build, idle_release_s=5)
    loop.manager = manager
    return loop


@pytest.fixture(scope="module")
def tiny_loop(tiny_loaded):
    config, (model, tokenizer, info) = tiny_loaded
    loop = start_loop(config, model, tokenizer, info)
    yield loop
    loop.stop()


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_loaded):
    return tiny_loaded[1][1]
