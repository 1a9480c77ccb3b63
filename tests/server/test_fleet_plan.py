"""The Fleet's memory shares without Ray: which model loads, which one makes room, and when
an idle one goes. The groups are stand-ins that say how much memory they take;
tests/server/test_fleet.py runs real ones."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest

from engine.config import EngineConfig, FleetConfig, ModelSpec
from engine.server.errors import Overloaded, UnknownModel
from engine.server.running.fleet import Fleet

MB = 1 << 20


class Groups:
    """start_group for the Fleet: a group taking `share` bytes; records loads and stops."""

    def __init__(self, share: int):
        self.share, self.events = share, []

    async def __call__(self, config, set_serving, name, placement):
        self.events.append(f"load {name}")
        events = self.events

        async def stop(within: float = 60.0) -> bool:
            events.append(f"unload {name}")
            return True

        return SimpleNamespace(
            memory=SimpleNamespace(total=self.share),
            info=SimpleNamespace(max_context=4096, path=name),
            frontend=SimpleNamespace(
                builder=SimpleNamespace(output_format="plain"), close=lambda: None
            ),
            stop=stop,
        )


def fleet(tmp_path, limit: int, share: int, **settings) -> tuple[Fleet, Groups]:
    models = tuple(ModelSpec(n, str(tmp_path)) for n in ("a", "b", "c"))
    config = EngineConfig().with_cache(
        cache_dir=str(tmp_path), memory_limit=limit, ram_budget=share
    )
    config = dataclasses.replace(config, fleet=FleetConfig(models=models, **settings))
    groups = Groups(share)
    f = Fleet(config.with_server(model_alias=("claude-*=c",)), groups, _serving)
    for member in f.members.values():  # the stand-ins' share, known before they load
        member.share = share
    return f, groups


async def _serving(up: bool) -> None:
    pass


def test_the_least_recently_used_idle_model_makes_room_and_a_busy_one_does_not(tmp_path):
    async def run():
        f, groups = fleet(tmp_path, limit=250 * MB, share=100 * MB, pin=("c",))
        f.deadline = 0.3
        await f.start()
        assert groups.events == ["load c", "load a"]  # pinned first, then what fits
        await f._ensure_loaded(f.resolve("b"))
        assert groups.events == ["load c", "load a", "unload a", "load b"]
        f.members["b"].active = 1  # serving a request
        with pytest.raises(Overloaded, match="pinned or busy"):
            await f._ensure_loaded(f.resolve("a"))
        f.members["b"].active = 0
        await f._ensure_loaded(f.resolve("a"))
        assert groups.events[4:] == ["unload b", "load a"]
        assert {m.name: m.state for m in f.members.values()} == {
            "a": "loaded",
            "b": "unloaded",
            "c": "loaded",
        }

    asyncio.run(asyncio.wait_for(run(), 5))


def test_idle_models_go_and_the_pinned_one_stays(tmp_path):
    async def run():
        f, groups = fleet(tmp_path, limit=1000 * MB, share=100 * MB, pin=("a",), idle_unload=0.2)
        await f.start()
        assert groups.events == ["load a", "load b", "load c"]
        f.members["c"].active = 1  # busy: stays however long
        await asyncio.sleep(0.8)
        assert sorted(groups.events[3:]) == ["unload b"]
        f.members["c"].active = 0
        await asyncio.sleep(0.8)
        assert sorted(groups.events[3:]) == ["unload b", "unload c"]
        await f.stop(_nothing)

    asyncio.run(asyncio.wait_for(run(), 5))


async def _nothing() -> None:
    pass


def test_names_and_aliases_route_and_an_unknown_name_lists_the_models(tmp_path):
    f, _ = fleet(tmp_path, limit=1000 * MB, share=100 * MB)
    assert [f.resolve(n).name for n in ("", "b", "claude-sonnet")] == ["a", "b", "c"]
    with pytest.raises(UnknownModel, match=r"a \(unloaded\), b \(unloaded\), c \(unloaded\)"):
        f.resolve("gpt-5")
