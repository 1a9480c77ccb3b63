"""Several models declared with repeated --model: names, options, per-model trees."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, ModelSpec
from engine.config.fleet import alias_targets, parse_model_spec


@pytest.mark.parametrize(
    "text, spec",
    [
        ("/models/qwen", ModelSpec("", "/models/qwen")),
        ("/models/a=b", ModelSpec("", "/models/a=b")),  # '=' inside a path: still a path
        ("big=/models/qwen", ModelSpec("big", "/models/qwen")),
        ("small=", ModelSpec("small", None)),  # the embedded model
        (
            "big=/m,output_format=plain,resource=node_a,resource=gpu:0.5",
            ModelSpec("big", "/m", output_format="plain", resources=(("node_a", 1), ("gpu", 0.5))),
        ),
    ],
)
def test_model_spec(text, spec):
    assert parse_model_spec(text) == spec


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"model": ["a=/x", "/y"]}, "name each"),
        ({"model": ["a=/x", "a=/y"]}, "given twice"),
        ({"model": ["a=/x,colour=red"]}, "KEY=VALUE"),
        ({"model": ["a b=/x"]}, "model name"),
        ({"model": ["a=/x"], "pin": ["b"]}, "--pin"),
        ({"model": ["a=/x"], "idle_unload": "-3"}, "--idle-unload"),
    ],
)
def test_refused(flags, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_sources(flags, {})


def test_one_path_keeps_its_meaning():
    config = EngineConfig.from_sources({"model": "/models/qwen"}, {})
    assert config.model.path == "/models/qwen" and not config.fleet.several
    assert EngineConfig.from_sources({}, {"LINEAGE_MODEL": "/m"}).model.path == "/m"


def test_each_model_has_its_own_tree(tmp_path):
    config = EngineConfig.from_sources(
        {
            "model": ["big=/m/big,output_format=plain", "small="],
            "cache_dir": str(tmp_path),
            "ray_namespace": "ns",
            "idle_unload": "30",
            "pin": ["small"],
        },
        {},
    )
    assert config.fleet.several and config.fleet.pin == ("small",)
    assert config.fleet.idle_unload == 30
    big = config.for_model(config.fleet.named("big"))
    small = config.for_model(config.fleet.named("small"))
    assert (big.model.path, small.model.path) == ("/m/big", None)
    assert (big.prompt.output_format, small.prompt.output_format) == ("plain", "auto")
    assert big.cache.cache_dir == str(tmp_path / "fleet" / "big")
    assert small.cache.cache_dir == str(tmp_path / "fleet" / "small")
    assert (big.server.ray_namespace, small.server.ray_namespace) == ("ns-big", "ns-small")


def test_alias_targets():
    names = ("big", "small")
    got = alias_targets(("claude-*haiku*=small", "claude-*"), names)
    assert got == {"claude-*haiku*": "small", "claude-*": "big"}
    with pytest.raises(ValueError, match="'tiny' is not a declared model"):
        alias_targets(("gpt-*=tiny",), names)


@pytest.mark.parametrize(
    "requested, model",
    [
        ("", "big"),
        ("small", "small"),
        ("claude-3-5-haiku-latest", "small"),  # the longer pattern wins, whatever the order
        ("claude-sonnet-4-5", "big"),
        ("gpt-5", None),
    ],
)
def test_routed(requested, model):
    from engine.config.fleet import routed

    patterns = [("claude-*", "big"), ("claude-*haiku*", "small")]
    assert routed(requested, ("big", "small"), patterns) == model
