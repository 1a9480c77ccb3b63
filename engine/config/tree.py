"""The configuration tree, and its one builder from flags and the environment.

`EngineConfig` holds the branches: model, cache, server, prompt, kernels, limits and
fleet (the models served together; `for_model` derives each one's tree), each
a frozen dataclass in a module of its own with its settings declared beside their
fields. `EngineConfig.from_sources(flags, env)` reads every setting (a flag wins
over its variable, which wins over its default) and applies what depends on the
machine: the RAM budget at most half its memory, the disk budget at most half the
disk room. Nothing below `main()` reads the environment or an argparse namespace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from engine.config.cache import CacheConfig, default_cache_dir
from engine.config.declare import UNSET, read_settings, setting_named
from engine.config.fleet import FleetConfig, ModelSpec
from engine.config.kernels import KernelConfig
from engine.config.limits import Limits
from engine.config.machine import disk_room, machine_memory
from engine.config.model import ModelConfig
from engine.config.prompt import PromptConfig
from engine.config.server import Identity, ServerConfig, read_token_file


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    kernels: KernelConfig = field(default_factory=KernelConfig)
    limits: Limits = field(default_factory=Limits)
    fleet: FleetConfig = field(default_factory=FleetConfig)

    @staticmethod
    def from_sources(
        flags: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> "EngineConfig":
        """Build the tree: CLI flags win over the environment, which wins over defaults.

        ``flags`` holds the flags the user gave, by setting name (None values are
        ignored). Raises ValueError naming the flag and variable of a value that
        does not parse.
        """
        flags = {k: v for k, v in (flags or {}).items() if v is not None}
        env = dict(os.environ if env is None else env)
        fleet = FleetConfig(**read_settings(FleetConfig, flags, env))
        # One model (a bare PATH, or none: the embedded one) is the model branch's; with
        # several, each one's comes from for_model.
        path = fleet.models[0].path if fleet.models and not fleet.several else None
        return EngineConfig(
            model=ModelConfig(**read_settings(ModelConfig, flags, env), path=path),
            cache=_cache(flags, env),
            server=_server(flags, env),
            prompt=PromptConfig(**read_settings(PromptConfig, flags, env)),
            kernels=KernelConfig(**read_settings(KernelConfig, flags, env)),
            limits=Limits(**read_settings(Limits, flags, env)),
            fleet=fleet,
        )

    def for_model(self, spec: ModelSpec) -> "EngineConfig":
        """One declared model's tree: its directory and options, its own cache directory
        (a subdirectory named after it) and Ray namespace, and no fleet of its own."""
        model = replace(self.model, path=spec.path)
        if spec.speculative is not None or spec.draft_model is not None:
            model = replace(
                model,
                speculative=spec.speculative or model.speculative,
                draft_model=spec.draft_model or model.draft_model,
            )
        prompt = self.prompt
        if spec.output_format is not None:
            prompt = replace(prompt, output_format=spec.output_format)
        base = Path(self.cache.cache_dir) if self.cache.cache_dir else default_cache_dir()
        return replace(
            self,
            model=model,
            prompt=prompt,
            cache=replace(self.cache, cache_dir=str(base / "fleet" / spec.name)),
            server=replace(self.server, ray_namespace=f"{self.server.ray_namespace}-{spec.name}"),
            fleet=FleetConfig(),
        )

    def with_cache(self, **changes) -> "EngineConfig":
        return replace(self, cache=replace(self.cache, **changes))

    def with_model(self, **changes) -> "EngineConfig":
        return replace(self, model=replace(self.model, **changes))

    def with_server(self, **changes) -> "EngineConfig":
        return replace(self, server=replace(self.server, **changes))

    def with_kernels(self, **changes) -> "EngineConfig":
        return replace(self, kernels=replace(self.kernels, **changes))


def _given(cls: type, name: str, flags: Mapping[str, object], env: Mapping[str, str]):
    """A setting's value when a flag or variable gives one, else None."""
    value = setting_named(cls, name).read(flags, env)
    return None if value is UNSET else value


def _cache(flags: Mapping[str, object], env: Mapping[str, str]) -> CacheConfig:
    values = read_settings(CacheConfig, flags, env)
    if _given(CacheConfig, "cache_mode", flags, env) is None and env.get("APC_LINEAGE") == "0":
        values["mode"] = "exact"  # the old switch
    ram = min(values["ram_budget"], machine_memory() // 2)
    cache_dir = Path(values["cache_dir"]) if values["cache_dir"] else default_cache_dir()
    return CacheConfig(
        **{
            **values,
            "ram_budget": ram,
            # Not given: a default, sized by the memory shares once the weights are known.
            "ram_budget_auto": _given(CacheConfig, "ram_budget", flags, env) is None,
            "anchor_max_bytes": min(CacheConfig.anchor_max_bytes, ram),
            "disk_budget": min(values["disk_budget"], disk_room(cache_dir) // 2),
        }
    )


def _server(flags: Mapping[str, object], env: Mapping[str, str]) -> ServerConfig:
    tokens: tuple[Identity, ...] = ()
    token_file = _given(ServerConfig, "auth_token_file", flags, env)
    if token_file:
        tokens = read_token_file(token_file)
    token = _given(ServerConfig, "auth_token", flags, env)
    if token:
        tokens = (Identity(token, "", admin=True),) + tokens
    return ServerConfig(**read_settings(ServerConfig, flags, env), tokens=tokens)
