"""What `lineage` imports: its parser and its client commands stay cheap.

Each check runs the command in a subprocess of its own (a fresh `sys.modules`)
and reads what it loaded: building the parser loads no MLX, Ray or benchmark;
`lineage bench -h` lists the benchmarks without importing one, and `lineage bench
NAME` imports that one alone; `lineage stats` against a real server never loads
MLX or Ray.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from clients.cli.bench import BENCHES

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("mlx", "mlx_lm", "ray")


def _run_lineage(argv: list[str]) -> tuple[int, dict]:
    """Run `lineage argv` in a fresh interpreter: (exit code, {"heavy", "bench"} modules)."""
    code = (
        "import json, sys\n"
        "from clients.cli.main import main\n"
        f"code = main({argv!r}, env={{}})\n"
        "mods = sorted(sys.modules)\n"
        f"heavy = [m for m in mods if m.split('.')[0] in {HEAVY!r}]\n"
        "bench = [m for m in mods if m.startswith('clients.bench')]\n"
        "print('\\n' + json.dumps({'heavy': heavy, 'bench': bench}))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_the_parser_imports_neither_mlx_nor_ray():
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {HEAVY!r} or name.startswith('clients.bench'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from clients.cli import main\n"
        "main.build_parser().parse_args(['generate', '--prompt', 'x'])\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_bench_help_lists_every_benchmark_and_imports_none():
    code, loaded = _run_lineage(["bench", "-h"])
    assert code == 0
    assert loaded == {"heavy": [], "bench": []}


def test_a_bench_command_imports_its_own_module_alone():
    code, loaded = _run_lineage(["bench", "load", "-h"])
    assert code == 0
    assert "clients.bench.load" in loaded["bench"]
    others = [f"clients.bench.{name}" for name in BENCHES if name != "load"]
    assert not set(others) & set(loaded["bench"])


def test_the_benches_table_says_what_each_module_says():
    import importlib

    for name, (module_name, help) in BENCHES.items():
        assert module_name == f"clients.bench.{name}"
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an optional extra the table still names
            continue
        assert help == module.HELP, name


def test_stats_against_a_real_server_loads_neither_mlx_nor_ray(engine):
    code, loaded = _run_lineage(["stats", "--server", engine.address])
    assert code == 0
    assert loaded["heavy"] == [] and loaded["bench"] == []
