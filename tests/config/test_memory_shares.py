"""The memory shares (engine.config.share_memory), pure: what the limit holds and what is kept.

The case it is sized for: a 64 GB machine serving a 35 GB model. The old defaults
(a RAM tier of min(48G, RAM/2) plus a pool of a quarter of it, weights not
counted) asked for 35 + 32 + 8 = 75 GB.
"""

from __future__ import annotations

import pytest

from engine.config import GB, CacheConfig, EngineConfig, ModelConfig, share_memory

MB = 1 << 20


def _config(**cache) -> EngineConfig:
    """What `lineage serve` builds without --ram-budget: the RAM budget is sized by its share."""
    return EngineConfig(cache=CacheConfig(**{"ram_budget_auto": True, **cache}))


def test_a_35g_model_on_a_64g_machine_does_not_over_commit():
    shares = share_memory(
        _config(), weights=35 * GB, kv_bytes_per_token=192 << 10, max_context=32768, machine=64 * GB
    )
    assert shares.limit == 48 * GB  # three quarters of the machine
    assert shares.weights == 35 * GB
    assert shares.running_kv == shares.max_batch_tokens * (192 << 10)
    assert shares.running_kv >= 1024 * (192 << 10), "room for at least one request"
    assert shares.total <= shares.limit < 64 * GB, shares
    # What the weights leave is shared: a quarter for the running KV, the rest for the cache.
    free = shares.limit - shares.weights
    assert shares.running_kv <= free // 4
    assert shares.ram_budget + shares.pool_limit <= free - shares.running_kv - shares.grammars
    assert shares.grammars == 64 * (2 << 20)  # --grammar-cache compiled grammars kept
    assert shares.ram_budget > 4 * GB and shares.pool_limit >= 0


@pytest.mark.parametrize("machine_gb", [16, 24, 64, 128, 512])
@pytest.mark.parametrize("weights_share", [0.0, 0.1, 0.5, 0.7])
def test_the_defaults_fit_the_limit(machine_gb, weights_share):
    machine = machine_gb * GB
    weights = int(machine * 3 // 4 * weights_share)
    shares = share_memory(_config(), weights, 64 << 10, 131072, machine=machine)
    assert shares.total <= shares.limit == machine * 3 // 4, shares
    assert 0 <= shares.ram_budget <= 48 * GB and 0 <= shares.pool_limit <= 16 * GB
    assert shares.max_batch_tokens <= 8 * 131072  # at most max_batch full contexts


def test_what_the_operator_sets_is_kept():
    config = EngineConfig(
        model=ModelConfig(max_batch_tokens=4096),
        cache=CacheConfig(ram_budget=2 * GB, memory_limit=20 * GB, pool_limit=512 * MB),
    )
    shares = share_memory(config, weights=8 * GB, kv_bytes_per_token=1 << 10, max_context=8192)
    assert (shares.limit, shares.max_batch_tokens, shares.running_kv) == (20 * GB, 4096, 4 * MB)
    assert (shares.ram_budget, shares.pool_limit) == (2 * GB, 512 * MB)


def test_a_given_ram_budget_sizes_its_pool_and_the_limit_still_counts_the_weights():
    config = EngineConfig(cache=CacheConfig(ram_budget=8 * GB, memory_limit=40 * GB))
    shares = share_memory(config, weights=20 * GB, kv_bytes_per_token=128 << 10, max_context=32768)
    assert shares.ram_budget == 8 * GB and shares.pool_limit == 2 * GB
    assert shares.running_kv <= (40 - 20) * GB // 4


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("machine_gb", [64, 192, 512])
@pytest.mark.parametrize("weights_gb", [1, 10])
def test_each_replica_on_a_machine_counts_its_weights_batch_and_pool(
    replicas, machine_gb, weights_gb
):
    """Replicas of one machine each load the weights, run a batch and keep an MLX pool;
    the RAM tier is the one index's. Counting the weights once over-commits."""
    machine = machine_gb * GB
    shares = share_memory(
        _config(), weights_gb * GB, 64 << 10, 32768, machine=machine, replicas=replicas
    )
    k = shares.replicas
    assert k == replicas
    per_replica = weights_gb * GB + shares.pool_limit + shares.grammars  # its compiled grammars
    spent = k * per_replica + shares.running_kv + shares.ram_budget
    assert spent == shares.total <= shares.limit == machine * 3 // 4, shares
    assert shares.running_kv == k * shares.max_batch_tokens * (64 << 10)
    one = share_memory(_config(), weights_gb * GB, 64 << 10, 32768, machine=machine)
    assert shares.ram_budget <= one.ram_budget and shares.max_batch_tokens <= one.max_batch_tokens


def test_a_draft_model_is_in_the_plan_beside_each_replicas_weights():
    """A draft model (--draft-model) is loaded by each replica beside the served one: left
    out, the shares would give its room to the cache and over-commit the machine."""
    args = (_config(), 20 * GB, 64 << 10, 32768)
    without = share_memory(*args, machine=64 * GB, replicas=2)
    shares = share_memory(*args, machine=64 * GB, replicas=2, draft=3 * GB)
    assert without.total + 2 * 3 * GB > without.limit  # what the draft model would add
    assert shares.draft == 3 * GB and shares.total <= shares.limit, shares
    per_replica = shares.weights + shares.draft + shares.pool_limit + shares.grammars
    assert shares.total == 2 * per_replica + shares.running_kv + shares.ram_budget
    assert shares.ram_budget < without.ram_budget
