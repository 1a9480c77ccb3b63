"""The memory shares: how the memory limit is shared once the model is loaded.

What the weights (each replica's), the running sequences' KV, the RAM tier
and MLX's pools may take, from the configuration and the figures measured at
load; `with_memory` writes the shares into the configuration the actors are
given. Pure arithmetic: it reads no model and starts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from engine.config.machine import machine_memory
from engine.config.units import GB

if TYPE_CHECKING:
    from engine.config.tree import EngineConfig


@dataclass(frozen=True)
class MemoryShares:
    """How the memory limit is shared once the model is loaded (bytes, and tokens).

    `replicas`: the model replicas on one machine. Each holds its own weights,
    runs its own batch (of `max_batch_tokens`) and has its own MLX pool; the RAM
    tier's budget is the one index's, shared by them all."""

    limit: int
    weights: int  # one replica's
    kv_bytes_per_token: int
    max_batch_tokens: int  # running sequences' prompt + max_tokens, together, per replica
    running_kv: int  # the KV those tokens hold at most, every replica's together
    ram_budget: int  # the cache's RAM tier
    pool_limit: int  # MLX's buffer pool, per replica
    replicas: int = 1
    grammars: int = 0  # the compiled grammars kept, per replica (at most, estimated)
    draft: int = 0  # the draft model's weights, per replica (--draft-model)

    @property
    def total(self) -> int:
        k = self.replicas
        per_replica = self.weights + self.draft + self.pool_limit + self.grammars
        return per_replica * k + self.running_kv + self.ram_budget


POOL_MAX = 16 * GB  # an upper bound on a replica's kept MLX buffer pool, whatever the budget


def pool_limit(ram_budget: int, configured: int | None = None) -> int:
    """MLX's buffer-pool cap: as configured, else a quarter of the RAM budget, at most 16 GB."""
    return configured if configured is not None else min(POOL_MAX, ram_budget // 4)


# One compiled grammar kept (its pristine matcher and lexer tables): llguidance reports no
# size; the process grew 1.4 MB over the first compile of a 10-tool set, at 4k and at 150k.
GRAMMAR_BYTES = 2 << 20


def share_memory(
    config: EngineConfig,
    weights: int,
    kv_bytes_per_token: int,
    max_context: int,
    machine: int | None = None,
    replicas: int = 1,
    draft: int = 0,
) -> MemoryShares:
    """Share the memory limit between weights, running KV, the RAM tier and the pool.

    What the user set is kept. Otherwise, of what the weights leave (each of the
    `replicas` on the machine loads its own): a quarter for the running
    sequences' KV (at most max_batch full contexts per replica), the compiled
    grammars each replica keeps (`--grammar-cache` of them), and the rest for
    the RAM tier (at most 48G) and the replicas' pools (at most 16G each), so
    the defaults never over-commit the machine. `draft`: a draft model's weights,
    which each replica loads beside its own.
    """
    cache, model = config.cache, config.model
    k = max(1, replicas)
    limit = cache.memory_limit or (machine or machine_memory()) * 3 // 4
    free = max(0, limit - (weights + draft) * k)
    per_token = max(1, kv_bytes_per_token)
    tokens = model.max_batch_tokens
    if tokens is None:
        tokens = min(model.max_batch * max_context, free // 4 // k // per_token)
        tokens = max(tokens, min(max_context, 1024))
    running = tokens * per_token * k
    grammars = model.grammar_cache * GRAMMAR_BYTES
    if cache.ram_budget_auto:
        rest = max(0, free - running - grammars * k)
        ram = min(48 * GB, rest * 4 // 5)
        pool = min(POOL_MAX, (rest - ram) // k)
    else:
        ram = cache.ram_budget
        pool = min(POOL_MAX, ram // 4 // k)
    if cache.pool_limit is not None:
        pool = cache.pool_limit
    return MemoryShares(
        limit, weights, kv_bytes_per_token, tokens, running, ram, pool, k, grammars, draft
    )


def with_memory(config: EngineConfig, shares: MemoryShares) -> EngineConfig:
    """The configuration with the shares' budgets written in (what the actors are given)."""
    cache = replace(
        config.cache,
        ram_budget=shares.ram_budget,
        ram_budget_auto=False,
        pool_limit=shares.pool_limit,
        anchor_max_bytes=min(config.cache.anchor_max_bytes, shares.ram_budget),
    )
    return replace(
        config, cache=cache, model=replace(config.model, max_batch_tokens=shares.max_batch_tokens)
    )
