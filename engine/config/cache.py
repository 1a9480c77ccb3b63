"""The cache branch of the configuration: mode, budgets, capture points, the disk tier.

Each operator setting is declared once here, beside its field (engine.config.declare);
the fields without one are the policy's constants. The budgets' machine-derived
defaults are applied by `EngineConfig.from_sources` and the memory shares, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config.declare import label_of, setting
from engine.config.units import GB, parse_bytes

CACHE_MODES = ("lineage", "exact", "off")
# How a checkpoint's recurrent states are kept (engine.runtime.packed_state).
CHECKPOINT_PRECISIONS = ("exact", "float16", "bfloat16", "int8")
KV_PRECISIONS = ("exact", "int8", "int4")


def default_cache_dir() -> Path:
    """The platform's user cache directory for the engine."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("lineage-engine"))


@dataclass(frozen=True)
class CacheConfig:
    """Cache, memory and the disk tier."""

    mode: str = setting(
        "lineage",
        "lineage, exact (whole-prompt snapshots by exact prefix, plain LRU: the baseline) or "
        "off; APC_LINEAGE=0 also means exact",
        name="cache_mode",
        choices=CACHE_MODES,
    )
    ram_budget: int = setting(
        48 * GB,
        "the RAM tier's budget, at most half the machine's memory",
        parse=parse_bytes,
        shown="sized from memory (at most 48.0 GiB)",
    )
    # True: ram_budget is a default, sized by share_memory once the weights are known.
    ram_budget_auto: bool = False
    # Everything the engine holds: weights + running sequences' KV + RAM tier + MLX pool.
    memory_limit: int | None = setting(
        None,
        "weights + running KV + RAM tier + MLX pool",
        parse=parse_bytes,
        shown="3/4 of the machine's memory",
    )
    checkpoint_precision: str = setting(
        "exact",
        "how checkpoints keep their recurrent states in the RAM tier and on disk: exact "
        "(bit for bit), float16 (over a per-row scale: half), bfloat16 (half) or int8 "
        "(groupwise 8-bit, about a quarter); --cache-mode exact keeps them exact",
        choices=CHECKPOINT_PRECISIONS,
    )
    kv_precision: str = setting(
        "exact",
        "how stored entries keep their KV rows in the RAM tier and on disk: exact (the "
        "model's dtype), int8 or int4 (groupwise, about 53% and 28% of bfloat16); the "
        "batch computes in the model's dtype; --cache-mode exact keeps them exact",
        choices=KV_PRECISIONS,
    )
    anchor_max_entries: int = 16
    anchor_max_bytes: int = 16 * GB
    max_checkpoints: int = 4  # per lineage; anchors are separate entries
    guard_offset: int = 16  # guard checkpoint at prompt length minus this
    # Guard only when the uncached suffix is this long. None: derived at load from
    # the measured per-forward and per-token costs (engine.runtime.model.loader), what
    # `from_sources` gives unless --guard-min-suffix is set; a CacheConfig built
    # directly (tests, the pure policy) keeps the reference's fixed 256.
    guard_min_suffix: int | None = setting(
        256,
        "capture a guard (prompt minus 16) when the uncached suffix is this long",
        metavar="TOKENS",
        default=None,
        shown="derived from the per-forward and per-token costs measured at load",
    )
    # State-only checkpoints inside every long message (a user message, a tool result,
    # an assistant message) from its start, every eighth of it, never closer than this:
    # the floor chosen from a capture's and a checkpoint's measured costs
    # (engine.cache.message_points; the figures: docs/benchmarks.md).
    message_interval: int = setting(
        256,
        "the least spacing of the state checkpoints inside a long message, which get one "
        "every eighth of their length from their start (0: none)",
        metavar="TOKENS",
    )
    # Inside the (system + tools) block every third of it, never closer than this: the
    # anchor restores the whole block, and these points only serve other sessions'
    # variants of it, so they hold a lineage's slots only where they save thousands.
    system_interval: int = 2048
    message_max: int = 4  # points of both kinds a prefill captures, at most
    divergence_min_gain: int = 256
    # A conversation restored from an anchor or a sibling that stays reads its first
    # rows from that entry when it restored at least this many (engine.cache.shared_rows).
    shared_rows_min: int = 64
    anchor_slack: int = 2  # BPE merges at the anchor boundary
    exact_max_entries: int = 8  # exact mode: plain LRU by entry count and bytes
    cache_dir: str | None = setting(
        None, "the disk tier's directory", metavar="DIR", shown="the platform's user cache dir"
    )
    disk_budget: int = setting(
        1 << 40,
        "the disk tier's budget, at most half of (free disk + the cache's own files)",
        parse=parse_bytes,
    )
    # Past the cap a write is refused and its file never indexed.
    disk_queue_bytes: int | None = setting(
        None,
        "bytes of file writes queued; past it a write is refused",
        name="disk_queue_limit",
        parse=parse_bytes,
        shown="a quarter of the RAM budget, at least 256.0 MiB",
    )
    spill_on_evict: bool = True
    clear_pool_per_prefill: bool = setting(
        False, "mx.clear_cache() after every prefill chunk", name="clear_pool", flag=None
    )
    pool_limit: int | None = setting(
        None,
        "MLX's buffer-pool cap",
        parse=parse_bytes,
        flag=None,
        shown="sized from the RAM budget",
    )
    layer_timer_flag: str | None = setting(
        None,
        "a file whose presence turns on the per-layer timer",
        flag=None,
        shown="no timer",
    )
    layer_timer_requests: int = 4

    def __post_init__(self):
        if self.mode not in CACHE_MODES:
            raise ValueError(
                f"{label_of(CacheConfig, 'mode')}: cache mode {self.mode!r} is not one of "
                f"{', '.join(CACHE_MODES)}"
            )
        if self.checkpoint_precision not in CHECKPOINT_PRECISIONS:
            raise ValueError(
                f"{label_of(CacheConfig, 'checkpoint_precision')}: {self.checkpoint_precision!r}"
                f" is not one of {', '.join(CHECKPOINT_PRECISIONS)}"
            )
        if self.message_interval < 0:
            raise ValueError(
                f"{label_of(CacheConfig, 'message_interval')} must be 0 (no points) or "
                f"positive, got {self.message_interval}"
            )
        if self.disk_queue_bytes is not None and self.disk_queue_bytes <= 0:
            raise ValueError(
                f"{label_of(CacheConfig, 'disk_queue_bytes')} must be positive, "
                f"got {self.disk_queue_bytes}"
            )

    @property
    def stored_precision(self) -> str:
        """The precision checkpoints are kept at: exact mode's snapshots stay bit-exact."""
        return self.checkpoint_precision if self.mode == "lineage" else "exact"

    @property
    def stored_kv_precision(self) -> str:
        """The precision stored KV rows are kept at: exact mode's stay bit-exact."""
        return self.kv_precision if self.mode == "lineage" else "exact"

    @property
    def disk_queue_cap(self) -> int:
        """The disk writer's cap on queued bytes."""
        if self.disk_queue_bytes is not None:
            return self.disk_queue_bytes
        return max(self.ram_budget // 4, 256 << 20)

    @property
    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()
