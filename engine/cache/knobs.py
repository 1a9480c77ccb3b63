"""The cache config as the policy takes it: checked, its unmeasured threshold filled in.

`policy_config` gives the guard's minimum suffix its fixed default where no
measured threshold was given (engine.config.CacheConfig leaves it None), and
refuses a knob the policy cannot work with (a ValueError naming it). It knows
the knobs' names and bounds; nothing of what the policy does with them.
"""

from __future__ import annotations

from dataclasses import replace

from engine.config import CacheConfig

DEFAULT_GUARD_MIN_SUFFIX = 256  # where no measured threshold is given (CacheConfig)

# Knobs that count something (bytes, entries, tokens): none may be negative.
_COUNTS = (
    "ram_budget",
    "anchor_max_entries",
    "anchor_max_bytes",
    "max_checkpoints",
    "guard_min_suffix",
    "divergence_min_gain",
    "message_max",
    "exact_max_entries",
)


def policy_config(config: CacheConfig) -> CacheConfig:
    """`config` with the guard's default filled in; ValueError naming the first bad knob."""
    if config.guard_min_suffix is None:  # not measured: the reference's fixed threshold
        config = replace(config, guard_min_suffix=DEFAULT_GUARD_MIN_SUFFIX)
    for name in _COUNTS:
        if getattr(config, name) < 0:
            raise ValueError(f"cache config {name} must be >= 0, got {getattr(config, name)}")
    if config.guard_offset < 1:
        raise ValueError(f"cache config guard_offset must be >= 1, got {config.guard_offset}")
    return config
