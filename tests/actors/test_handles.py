"""The actors implement what the front end calls on them (engine.actors.handles).

Each method of `ModelCalls` and `ManagerCalls` exists on its actor with the same
parameters (names, kinds, defaults) and the same async-ness, and every `x.name.remote(...)`
call in engine/server/ names a method of one of the two Protocols. Plain inspection: no
Ray is started.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from engine.actors.cache_manager import CacheManagerActor
from engine.actors.handles import ManagerCalls, ModelCalls
from engine.actors.model import ModelActor

ROOT = Path(__file__).resolve().parents[2]


def protocol_methods(protocol) -> dict:
    return {
        name: value
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


def parameters(method) -> list:
    """(name, kind, default) of each parameter; Ray's tracing keyword is not the actor's."""
    found = inspect.signature(method).parameters.values()
    return [(p.name, p.kind, p.default) for p in found if not p.name.startswith("_ray")]


def mismatches(protocol, cls) -> list[str]:
    """One line per method of `protocol` that `cls` lacks or declares otherwise."""
    out = []
    for name, wanted in protocol_methods(protocol).items():
        got = getattr(cls, name, None)
        if got is None:
            out.append(f"{cls.__name__} has no {name}")
            continue
        if inspect.iscoroutinefunction(got) != inspect.iscoroutinefunction(wanted):
            out.append(f"{cls.__name__}.{name}: async differs")
        w, g = parameters(wanted), parameters(got)
        if w != g:
            out.append(f"{cls.__name__}.{name}: parameters {g} are not {w}")
    return out


def actor_class(actor):
    return actor.__ray_metadata__.modified_class


@pytest.mark.parametrize(
    "protocol, actor", [(ModelCalls, ModelActor), (ManagerCalls, CacheManagerActor)]
)
def test_each_actor_implements_its_protocol(protocol, actor):
    assert protocol_methods(protocol)
    assert mismatches(protocol, actor_class(actor)) == []


def test_a_missing_or_different_method_is_caught():
    class Partial:
        def info(self):
            pass

        def attach(self, manager):  # no peers
            pass

        def hello(self, loop_deadline: float = 10.0):  # not async
            pass

    found = mismatches(ModelCalls, Partial)
    assert "Partial has no submit" in found
    assert any(line.startswith("Partial.attach: parameters") for line in found)
    assert "Partial.hello: async differs" in found


def remote_calls(path: Path) -> set[str]:
    """The method names of every `x.name.remote(...)` call in the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "remote"
            and isinstance(node.func.value, ast.Attribute)
        ):
            names.add(node.func.value.attr)
    return names


def test_every_call_the_server_makes_on_an_actor_is_in_a_protocol():
    called = set().union(*(remote_calls(p) for p in (ROOT / "engine" / "server").rglob("*.py")))
    known = set(protocol_methods(ModelCalls)) | set(protocol_methods(ManagerCalls))
    assert called and called - known == set()
