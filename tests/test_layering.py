"""The layers' imports point one way (docs/architecture.md, "Layers").

Walks every module of `engine/` and `clients/` with `ast`, function-level
imports included, and fails on an arrow in the wrong direction. The rules
name a layer by its package prefix; a module is in the first layer whose
prefix it starts with. Two more rules hold across every module: no import
cycles (a `from package import submodule` depends on the submodule, not on
the package's `__init__`; imports under `if TYPE_CHECKING:` count too), and
no module imports another module's private name (`_x`).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A plain-Python module of the runtime: the cache's messages and plain runtime modules only.
PURE_RUNTIME = (
    "mlx",
    "mlx_lm",
    "ray",
    "grpc",
    "engine.storage",
    "engine.kernels",
    "engine.server",
    "engine.actors",
    "engine.proto",
    "clients",
)

# Plain Python: nothing of the engine, no MLX.
PLAIN = ("mlx", "mlx_lm", "ray", "grpc", "engine.", "clients")

# What every module of the runtime must not import.
OUTSIDE_RUNTIME = (
    "ray",
    "grpc",
    "engine.storage",
    "engine.server",
    "engine.actors",
    "engine.proto",
    "clients",
)

# The runtime's top, which composes its packages: no package imports it back.
RUNTIME_TOP = (
    "engine.runtime.generator",
    "engine.runtime.loop",
    "engine.runtime.local",
)

# The server's packages from the top floor down; the last three share the ground floor
# (none imports another) and import only `engine.server.errors` of the server.
SERVER_FLOORS = ("running", "rpc", "front", "prompts", "observe", "supervision", "security")
SERVER_GROUND = ("observe", "supervision", "security")

# layer -> import prefixes it must never import
FORBIDDEN = {
    "engine.cache": (
        "mlx",
        "mlx_lm",
        "ray",
        "grpc",
        "engine.storage",
        "engine.runtime",
        "engine.kernels",
        "engine.server",
        "engine.actors",
        "engine.proto",
        "clients",
    ),
    # Kernels sit under the runtime: MLX and mlx-lm only, plain values in.
    "engine.kernels": ("ray", "grpc", "engine.", "clients"),
    "engine.config": PLAIN,
    "engine.storage": ("ray", "grpc", "engine.server", "engine.actors", "engine.proto", "clients"),
    # The prefill policy is plain Python like the cache policy (a test imports it blocked).
    "engine.runtime.batching.prefill_policy": PLAIN,
    "engine.runtime.batching.chunk_costs": PLAIN,
    "engine.runtime.batching.prefill_log": PLAIN,
    "engine.runtime.batching.ring": PLAIN,
    # The ordering protocol and admission are plain Python too: the policy tests' fake
    # driver runs the same OrderLedger (tests/runtime/test_ordering.py imports them blocked).
    "engine.runtime.ordering": PURE_RUNTIME,
    # Admission sees the RAM tier through its own protocol: neither imports the other.
    "engine.runtime.admission": (*PURE_RUNTIME, "engine.runtime.tier"),
    # The runtime's packages (each __init__ says what it knows and its one way in):
    # grammars and matchers know nothing else of the engine;
    "engine.runtime.structured": ("ray", "grpc", "engine.", "clients"),
    # the cache contract over mlx-lm's layer caches knows nothing else of the engine;
    "engine.runtime.layer_caches": ("ray", "grpc", "engine.", "clients"),
    # speculation sits under the batch generators, beside the structured rows;
    "engine.runtime.speculative": (
        *OUTSIDE_RUNTIME,
        "engine.runtime.batching",
        "engine.runtime.tier",
        *RUNTIME_TOP,
    ),
    # the batch generators know the batch, not what is stored or who drives them;
    "engine.runtime.batching": (
        *OUTSIDE_RUNTIME,
        "engine.runtime.tier",
        "engine.runtime.model",
        *RUNTIME_TOP,
    ),
    # the RAM tier obeys Orders; it knows no batch, no drafts, no grammar;
    "engine.runtime.tier": (
        *OUTSIDE_RUNTIME,
        "engine.runtime.admission",
        "engine.runtime.batching",
        "engine.runtime.speculative",
        "engine.runtime.structured",
        "engine.runtime.model",
        *RUNTIME_TOP,
    ),
    # the served model's loading knows no batch, no grammar, no tier, no drafting
    # (speculation imports the model's files, never the other way).
    "engine.runtime.model": (
        *OUTSIDE_RUNTIME,
        "engine.runtime.batching",
        "engine.runtime.speculative",
        "engine.runtime.structured",
        "engine.runtime.tier",
        *RUNTIME_TOP,
    ),
    "engine.runtime": OUTSIDE_RUNTIME,
    "engine.actors": ("grpc", "engine.server", "engine.proto", "clients"),
    # The server's packages, top floor first: each imports only the floors below it
    # (engine/server/__init__.py is the map).
    **{
        f"engine.server.{name}": ("clients", *(f"engine.server.{up}" for up in SERVER_FLOORS[:i]))
        for i, name in enumerate(SERVER_FLOORS)
    },
    "engine.server": ("clients",),
    # models by name know the Hub and its cache: no MLX, no Ray, nothing of serving.
    "engine.hub": (
        "mlx",
        "mlx_lm",
        "ray",
        "grpc",
        "engine.cache",
        "engine.storage",
        "engine.runtime",
        "engine.kernels",
        "engine.server",
        "engine.actors",
        "engine.proto",
        "clients",
    ),
    "engine.proto": ("clients",),
    "engine": ("clients",),
}


# The exceptions to a layer's rule, each a plain module that another plain one may import.
ALLOWED = {"engine.runtime.batching.prefill_log": ("engine.runtime.batching.ring",)}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement in the file."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def layer_of(module: str) -> str | None:
    for layer in FORBIDDEN:  # most specific first (dict order)
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def violations(files, root: Path = ROOT) -> list[str]:
    """One line per import in the wrong direction: `path:line: layer imports target`."""
    out = []
    for path in files:
        module = module_name(path, root)
        layer = layer_of(module)
        if layer is None:
            continue
        for line, target in imports(path):
            for banned in FORBIDDEN[layer]:
                if banned.endswith("."):  # any submodule of it
                    hit = target.startswith(banned)
                else:
                    hit = target == banned or target.startswith(banned + ".")
                own = target == layer or target.startswith(layer + ".")
                allowed = any(
                    target == a or target.startswith(a + ".") for a in ALLOWED.get(layer, ())
                )
                if hit and not (own or allowed):
                    out.append(f"{path.relative_to(root)}:{line}: {layer} imports {target}")
    return sorted(set(out))


def sources() -> list[Path]:
    files = [*ROOT.glob("engine/**/*.py"), *ROOT.glob("clients/**/*.py")]
    return [p for p in files if "_pb2" not in p.name]


def test_every_layer_imports_only_downwards():
    found = sources()
    assert len(found) > 40, f"the walk found only {len(found)} modules"
    assert violations(found) == []


RUNTIME_PACKAGES = ("batching", "speculative", "structured", "tier", "model", "layer_caches")
BENCHMARKS = (
    "agents",
    "checkpoint",
    "concurrency",
    "decode",
    "faults",
    "kernels",
    "simulate",
    "memory",
    "load",
    "restart",
    "slowloris",
    "soak",
    "speculative",
    "structured",
    "warm",
)


def test_the_runtime_is_a_few_packages_each_with_its_index():
    runtime = ROOT / "engine" / "runtime"
    top = sorted(p.name for p in runtime.glob("*.py"))
    assert len(top) <= 15, top
    packages = sorted(p.parent.name for p in runtime.glob("*/__init__.py"))
    assert packages == sorted(RUNTIME_PACKAGES)
    for name in RUNTIME_PACKAGES:
        assert f"engine.runtime.{name}" in FORBIDDEN, f"no import rule for {name}"
        index = ast.get_docstring(ast.parse((runtime / name / "__init__.py").read_text()))
        assert index and "one way in" in index and "must not import" in index, name


def test_the_server_is_a_few_packages_each_with_its_index():
    server = ROOT / "engine" / "server"
    top = sorted(p.name for p in server.iterdir() if p.name != "__pycache__")
    assert len(top) <= 10, top
    assert sorted(p.parent.name for p in server.glob("*/__init__.py")) == sorted(SERVER_FLOORS)
    for name in SERVER_FLOORS:
        index = ast.get_docstring(ast.parse((server / name / "__init__.py").read_text()))
        assert index and "import" in index, name


def test_the_server_ground_floor_imports_nothing_of_the_server_but_its_errors():
    server = ROOT / "engine" / "server"
    for name in SERVER_GROUND:
        for path in (server / name).glob("*.py"):
            for line, module in imports(path):
                inside = module.startswith("engine.server.")
                own = module.startswith(f"engine.server.{name}") or module.startswith(
                    "engine.server.errors"
                )
                assert not inside or own, f"{path.relative_to(ROOT)}:{line} imports {module}"


def test_the_benchmarks_are_one_package_each_beside_the_shared_helpers():
    bench = ROOT / "clients" / "bench"
    top = sorted(p.name for p in bench.glob("*.py"))
    assert len(top) <= 8, top
    assert sorted(p.parent.name for p in bench.glob("*/__init__.py")) == sorted(BENCHMARKS)


def test_no_module_in_the_engine_root_but_init_and_the_config_package():
    root = sorted(p.name for p in (ROOT / "engine").glob("*.py"))
    assert root == ["__init__.py"]
    assert (ROOT / "engine" / "config" / "__init__.py").is_file()


@pytest.mark.parametrize(
    "layer, source, expected",
    [
        ("engine/cache/x.py", "import mlx.core as mx\n", "engine.cache imports mlx.core"),
        ("engine/cache/x.py", "from engine.storage import directory\n", "engine.storage"),
        ("engine/cache/x.py", "from engine.kernels import install\n", "engine.kernels"),
        ("engine/kernels/x.py", "from engine.config import KernelConfig\n", "engine.config"),
        ("engine/runtime/x.py", "def f():\n    from engine.server import serve\n", "server"),
        ("engine/runtime/ordering.py", "import mlx.core\n", "engine.runtime.ordering imports mlx"),
        (
            "engine/runtime/batching/prefill_policy.py",
            "import numpy\nfrom engine.runtime.requests import GenerationRequest\n",
            "engine.runtime.batching.prefill_policy imports engine.runtime.requests",
        ),
        (
            "engine/runtime/tier/x.py",
            "from engine.runtime.batching.batch import bound_pool\n",
            "engine.runtime.tier imports engine.runtime.batching",
        ),
        (
            "engine/runtime/structured/x.py",
            "from engine.runtime.requests import GenerationRequest\n",
            "engine.runtime.structured imports engine.runtime.requests",
        ),
        (
            "engine/runtime/layer_caches/x.py",
            "from engine.runtime.packed_state import PackedArray\n",
            "engine.runtime.layer_caches imports engine.runtime.packed_state",
        ),
        (
            "engine/runtime/speculative/x.py",
            "def f():\n    from engine.runtime.generator import Generator\n",
            "engine.runtime.speculative imports engine.runtime.generator",
        ),
        (
            "engine/runtime/model/x.py",
            "def f():\n    from engine.runtime.speculative.mtp import load_mtp\n",
            "engine.runtime.model imports engine.runtime.speculative",
        ),
        (
            "engine/runtime/tier/x.py",
            "from engine.runtime.admission import Wait\n",
            "engine.runtime.tier imports engine.runtime.admission",
        ),
        (
            "engine/runtime/admission.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from engine.runtime.tier.ram import RamTier\n",
            "engine.runtime.admission imports engine.runtime.tier",
        ),
        ("engine/server/x.py", "from clients.client import Client\n", "clients.client"),
        (
            "engine/server/prompts/x.py",
            "from engine.server.front.frontend import Frontend\n",
            "engine.server.prompts imports engine.server.front",
        ),
        (
            "engine/server/rpc/x.py",
            "def f():\n    from engine.server.running import serve\n",
            "engine.server.rpc imports engine.server.running",
        ),
        ("engine/x.py", "import clients.cli\n", "clients.cli"),
    ],
)
def test_a_wrong_arrow_is_caught(tmp_path, layer, source, expected):
    """The check itself: a planted import in the wrong direction is reported."""
    path = tmp_path / layer
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    found = violations([path], tmp_path)
    assert found and expected in found[0]


def test_imports_in_the_same_layer_are_allowed(tmp_path):
    path = tmp_path / "engine" / "runtime" / "x.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        "from engine.runtime.batching.batch import LineageBatchGenerator\nimport numpy\n"
    )
    assert violations([path], tmp_path) == []


# ---- cycles and private names -------------------------------------------------


def module_map(files, root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in files}


def dependencies(path: Path, modules: Iterable[str]) -> set[str]:
    """The modules of `modules` that the file imports (a submodule named by `from pkg
    import sub` counts as `pkg.sub` alone)."""
    known = set(modules)
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            out |= subs
            if node.module in known and len(subs) < len(node.names):
                out.add(node.module)
    return out


def cycles(files, root: Path = ROOT) -> list[list[str]]:
    """Every set of modules that import each other in a circle."""
    modules = module_map(files, root)
    return circles({m: dependencies(p, modules) - {m} for m, p in modules.items()})


def part_of(module: str, under: str) -> str | None:
    """The part of `under` that `module` belongs to: `under.x` for `under.x` and all below."""
    if not module.startswith(under + "."):
        return None
    return f"{under}.{module[len(under) + 1 :].split('.')[0]}"


def part_cycles(files, under: str, root: Path = ROOT) -> list[list[str]]:
    """Every set of the parts of `under` (its top modules and packages, each one node) that
    import each other in a circle: a knot no module-level circle shows, as when a
    package's module imports a top module that imports another module of the package."""
    graph: dict[str, set[str]] = {}
    for path in files:
        part = part_of(module_name(path, root), under)
        if part is None:
            continue
        targets = {part_of(target, under) for _, target in imports(path)}
        graph.setdefault(part, set()).update(targets - {None, part})
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, set())
    return circles(graph)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def private_imports(files, root: Path = ROOT) -> list[str]:
    """`path:line: imports module._name` for every private name taken from another module."""
    out = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if node.module.split(".")[0] not in ("engine", "clients"):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    rel = path.relative_to(root)
                    out.append(f"{rel}:{node.lineno}: imports {node.module}.{alias.name}")
    return sorted(out)


def test_no_module_imports_another_in_a_circle():
    assert cycles(sources()) == []


# The runtime's parts, the cache's and the server's: none imports another that imports
# it back, even through different modules.
PARTS = ("engine.runtime", "engine.cache", "engine.server", "engine")


@pytest.mark.parametrize("under", PARTS)
def test_no_part_imports_another_in_a_circle(under):
    assert part_cycles(sources(), under) == []


@pytest.mark.parametrize(
    "files, expected",
    [
        (  # a top module and a package, through a type-checking import
            {
                "engine/runtime/admission.py": "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from engine.runtime.tier.ram import RamTier\n",
                "engine/runtime/tier/ram.py": "",
                "engine/runtime/tier/restore.py": "from engine.runtime.admission import Emit\n",
            },
            [["engine.runtime.admission", "engine.runtime.tier"]],
        ),
        (  # two packages, one of them inside a function
            {
                "engine/runtime/model/loader.py": "def f():\n"
                "    from engine.runtime.speculative.draft_model import check_draft\n",
                "engine/runtime/speculative/speculation.py": "def g():\n"
                "    from engine.runtime.model.loader import resolve_model_path\n",
            },
            [["engine.runtime.model", "engine.runtime.speculative"]],
        ),
        (  # one way only: no circle
            {
                "engine/runtime/speculative/mtp.py": "from engine.runtime.model import x\n",
                "engine/runtime/model/x.py": "",
            },
            [],
        ),
    ],
)
def test_a_knot_between_parts_is_caught(tmp_path, files, expected):
    assert part_cycles(_plant(tmp_path, files), "engine.runtime", tmp_path) == expected


def test_no_module_imports_a_private_name_of_another():
    assert private_imports(sources()) == []


def _plant(root: Path, files: dict[str, str]) -> list[Path]:
    paths = []
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(path)
    return paths


@pytest.mark.parametrize(
    "files, expected",
    [
        (  # two modules importing each other, one of them inside a function
            {
                "clients/a.py": "import clients.b\n",
                "clients/b.py": "def f():\n    import clients.a\n",
            },
            [["clients.a", "clients.b"]],
        ),
        (  # a package whose __init__ imports a submodule that imports the package's names
            {
                "engine/p/__init__.py": "from engine.p.m import X\n",
                "engine/p/m.py": "from engine.p import Y\nX = 1\n",
            },
            [["engine.p", "engine.p.m"]],
        ),
        (  # `from package import submodule` is no arrow to the package's __init__
            {
                "engine/p/__init__.py": "from engine.p import m\n",
                "engine/p/m.py": "from engine.p import k\n",
                "engine/p/k.py": "",
            },
            [],
        ),
    ],
)
def test_a_circle_is_caught(tmp_path, files, expected):
    assert cycles(_plant(tmp_path, files), tmp_path) == expected


def test_a_private_import_is_caught(tmp_path):
    files = _plant(tmp_path, {"clients/a.py": "from clients.b import _helper, public\n"})
    assert private_imports(files, tmp_path) == ["clients/a.py:1: imports clients.b._helper"]


def unresolved_imports(files) -> list[str]:
    """Every `from engine... import x` / `from clients... import x` (function-level ones
    too) whose module or name does not exist: a module moved and an import left behind,
    which the arrows above cannot see."""
    import importlib

    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if not node.module.startswith(("engine", "clients")):
                continue
            try:
                module = importlib.import_module(node.module)
            except ImportError as e:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {e}")
                continue
            for alias in node.names:
                if hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    bad.append(
                        f"{path.relative_to(ROOT)}:{node.lineno}: no {alias.name} in {node.module}"
                    )
    return bad


def test_every_import_of_the_house_resolves():
    assert unresolved_imports(sources()) == []
