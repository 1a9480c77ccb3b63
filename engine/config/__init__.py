"""The one configuration tree of the engine (engine.config.tree), re-exported.

Frozen dataclasses, built once in ``main()`` from CLI flags and the environment
(``EngineConfig.from_sources``) and passed down. Each branch lives in a module
of its own with its operator settings declared beside their fields
(engine.config.declare; all of them listed by engine.config.catalog): `model`,
`cache`, `server`, `prompt`, `kernels`, `limits`, `fleet`. Beside them: byte sizes (`units`), what
the machine offers (`machine`) and the memory shares made once the model is loaded
(`memory`). This module only re-exports their names.
"""

from engine.config.cache import CACHE_MODES, CacheConfig, default_cache_dir
from engine.config.declare import parse_bool
from engine.config.fleet import FleetConfig, ModelSpec
from engine.config.kernels import GATED_DELTA_MODES, KERNEL_SETS, KernelConfig
from engine.config.limits import CACHE_BLOCK, MAX_JSON_DEPTH, MAX_REQUEST_BYTES, Limits
from engine.config.machine import machine_memory
from engine.config.memory import POOL_MAX, MemoryShares, share_memory, with_memory
from engine.config.model import PREFILL_EVALS, SCHEDULES, ModelConfig
from engine.config.prompt import OUTPUT_FORMATS, PromptConfig
from engine.config.server import (
    METRICS_NAMESPACE_TAGS,
    Identity,
    ServerConfig,
    is_loopback,
    read_token_file,
)
from engine.config.tree import EngineConfig
from engine.config.units import GB, format_bytes, parse_bytes

__all__ = [
    "CACHE_BLOCK",
    "CACHE_MODES",
    "GATED_DELTA_MODES",
    "KERNEL_SETS",
    "GB",
    "MAX_JSON_DEPTH",
    "MAX_REQUEST_BYTES",
    "METRICS_NAMESPACE_TAGS",
    "OUTPUT_FORMATS",
    "POOL_MAX",
    "PREFILL_EVALS",
    "SCHEDULES",
    "CacheConfig",
    "EngineConfig",
    "FleetConfig",
    "Identity",
    "KernelConfig",
    "Limits",
    "MemoryShares",
    "ModelSpec",
    "ModelConfig",
    "PromptConfig",
    "ServerConfig",
    "default_cache_dir",
    "format_bytes",
    "is_loopback",
    "machine_memory",
    "parse_bool",
    "parse_bytes",
    "share_memory",
    "read_token_file",
    "with_memory",
]
