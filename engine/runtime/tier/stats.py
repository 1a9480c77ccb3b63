"""What one replica's generator holds right now: its RAM tier, its batch, its disk writer.

Read on the model loop thread (`generator_stats(generator)`), returned as one
frozen value; the disk figures come from the storage layer's DiskStore.stats().
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GeneratorStats:
    entries: int  # entries held in the RAM tier
    ram_bytes: int
    active: int  # sequences in the batch (prefilling or decoding)
    pending: int  # requests submitted, not admitted yet
    pool_clears: int  # MLX buffer-pool clears per prefill (opt-in)
    disk: dict | None = None  # the disk store's writer and load figures; None: no disk tier
    pending_prefill_tokens: int = 0  # the pending requests' uncached prompt tokens
    mlx_active_bytes: int = 0  # MLX's allocated memory now
    mlx_peak_bytes: int = 0  # and at its highest since the process started
    ram_peak_bytes: int = 0  # the most the RAM tier held after any change since it started
    staged_bytes: int = 0  # finished requests' entries waiting for their commit's Orders
    loads_held: int = 0  # file reads held for requests waiting to restore from them
    token_checks: int = 0  # restores and incoming entries whose token ids were checked
    token_check_seconds: float = 0.0  # what those checks cost, in all
    token_mismatches: int = 0  # entries refused: computed on other tokens than the request's
    rejoined: int = 0  # entries that took their prefix entry's rows when it left
    grammars_compiled: int = 0  # compiled grammars: the grammar cache's misses
    grammar_hits: int = 0  # constrained requests whose grammar was compiled already
    grammars_held: int = 0  # compiled grammars kept (at most --grammar-cache)


def generator_stats(g) -> GeneratorStats:
    """The figures of generator `g` (call on its loop thread)."""
    import mlx.core as mx

    disk = g.tier.disk_tier
    return GeneratorStats(
        entries=len(g.tier.entries),
        ram_bytes=g.tier.nbytes,
        active=len(g.active),
        pending=len(g.pending),
        pool_clears=g.bg.pool.count,
        disk=disk.stats() if disk is not None else None,
        pending_prefill_tokens=sum(len(r.tokens) - r.plan.length for r, _ in g.pending),
        mlx_active_bytes=mx.get_active_memory(),
        mlx_peak_bytes=mx.get_peak_memory(),
        ram_peak_bytes=g.tier.peak,
        staged_bytes=g.tier.staged_bytes,
        loads_held=g.tier.loads,
        token_checks=g.tier.token_checks,
        token_check_seconds=g.tier.token_check_seconds,
        token_mismatches=g.tier.token_mismatches,
        rejoined=g.tier.rejoined,
        grammars_compiled=g.grammars.compiled,
        grammar_hits=g.grammars.hits,
        grammars_held=len(g.grammars.pristine),
    )
