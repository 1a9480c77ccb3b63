"""The memory plan (engine.config.plan_memory), pure: what the limit holds and what is kept.

The case it is sized for: a 64 GB machine serving a 35 GB model. The old defaults
(a RAM tier of min(48G, RAM/2) plus a pool of a quarter of it, weights not
counted) asked for 35 + 32 + 8 = 75 GB.
"""

from __future__ import annotations

import pytest

from engine.config import GB, CacheConfig, EngineConfig, ModelConfig, plan_memory

MB = 1 << 20


def _config(**cache) -> EngineConfig:
    """What `lineage serve` builds without --ram-budget: the RAM budget is sized by the plan."""
    return EngineConfig(cache=CacheConfig(**{"ram_budget_auto": True, **cache}))


def test_a_35g_model_on_a_64g_machine_does_not_over_commit():
    plan = plan_memory(
        _config(), weights=35 * GB, kv_bytes_per_token=192 << 10, max_context=32768, machine=64 * GB
    )
    assert plan.limit == 48 * GB  # three quarters of the machine
    assert plan.weights == 35 * GB
    assert plan.running_kv == plan.max_batch_tokens * (192 << 10)
    assert plan.running_kv >= 1024 * (192 << 10), "room for at least one request"
    assert plan.total <= plan.limit < 64 * GB, plan
    # What the weights leave is shared: a quarter for the running KV, the rest for the cache.
    free = plan.limit - plan.weights
    assert plan.running_kv <= free // 4
    assert plan.ram_budget + plan.pool_limit <= free - plan.running_kv - plan.grammars
    assert plan.grammars == 64 * (2 << 20)  # --grammar-cache compiled grammars kept
    assert plan.ram_budget > 4 * GB and plan.pool_limit >= 0


@pytest.mark.parametrize("machine_gb", [16, 24, 64, 128, 512])
@pytest.mark.parametrize("weights_share", [0.0, 0.1, 0.5, 0.7])
def test_the_defaults_fit_the_limit(machine_gb, weights_share):
    machine = machine_gb * GB
    weights = int(machine * 3 // 4 * weights_share)
    plan = plan_memory(_config(), weights, 64 << 10, 131072, machine=machine)
    assert plan.total <= plan.limit == machine * 3 // 4, plan
    assert 0 <= plan.ram_budget <= 48 * GB and 0 <= plan.pool_limit <= 16 * GB
    assert plan.max_batch_tokens <= 8 * 131072  # at most max_batch full contexts


def test_what_the_operator_sets_is_kept():
    config = EngineConfig(
        model=ModelConfig(max_batch_tokens=4096),
        cache=CacheConfig(ram_budget=2 * GB, memory_limit=20 * GB, pool_limit=512 * MB),
    )
    plan = plan_memory(config, weights=8 * GB, kv_bytes_per_token=1 << 10, max_context=8192)
    assert (plan.limit, plan.max_batch_tokens, plan.running_kv) == (20 * GB, 4096, 4 * MB)
    assert (plan.ram_budget, plan.pool_limit) == (2 * GB, 512 * MB)


def test_a_given_ram_budget_sizes_its_pool_and_the_limit_still_counts_the_weights():
    config = EngineConfig(cache=CacheConfig(ram_budget=8 * GB, memory_limit=40 * GB))
    plan = plan_memory(config, weights=20 * GB, kv_bytes_per_token=128 << 10, max_context=32768)
    assert plan.ram_budget == 8 * GB and plan.pool_limit == 2 * GB
    assert plan.running_kv <= (40 - 20) * GB // 4


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("machine_gb", [64, 192, 512])
@pytest.mark.parametrize("weights_gb", [1, 10])
def test_each_replica_on_a_machine_counts_its_weights_batch_and_pool(
    replicas, machine_gb, weights_gb
):
    """Replicas of one machine each load the weights, run a batch and keep an MLX pool;
    the RAM tier is the one index's. Counting the weights once over-commits."""
    machine = machine_gb * GB
    plan = plan_memory(
        _config(), weights_gb * GB, 64 << 10, 32768, machine=machine, replicas=replicas
    )
    k = plan.replicas
    assert k == replicas
    per_replica = weights_gb * GB + plan.pool_limit + plan.grammars  # its compiled grammars
    spent = k * per_replica + plan.running_kv + plan.ram_budget
    assert spent == plan.total <= plan.limit == machine * 3 // 4, plan
    assert plan.running_kv == k * plan.max_batch_tokens * (64 << 10)
    one = plan_memory(_config(), weights_gb * GB, 64 << 10, 32768, machine=machine)
    assert plan.ram_budget <= one.ram_budget and plan.max_batch_tokens <= one.max_batch_tokens


def test_a_draft_model_is_in_the_plan_beside_each_replicas_weights():
    """A draft model (--draft-model) is loaded by each replica beside the served one: left
    out, the plan would give its room to the cache and over-commit the machine."""
    args = (_config(), 20 * GB, 64 << 10, 32768)
    without = plan_memory(*args, machine=64 * GB, replicas=2)
    plan = plan_memory(*args, machine=64 * GB, replicas=2, draft=3 * GB)
    assert without.total + 2 * 3 * GB > without.limit  # what the draft model would add
    assert plan.draft == 3 * GB and plan.total <= plan.limit, plan
    per_replica = plan.weights + plan.draft + plan.pool_limit + plan.grammars
    assert plan.total == 2 * per_replica + plan.running_kv + plan.ram_budget
    assert plan.ram_budget < without.ram_budget
