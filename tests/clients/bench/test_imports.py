"""Building a benchmark's parser is cheap: no benchmark module loads MLX, Ray or matplotlib
when it is imported, only when it runs (a fresh interpreter, so nothing is loaded before)."""

from __future__ import annotations

import json
import subprocess
import sys

from clients.cli.bench import BENCHES

HEAVY = ("mlx", "mlx_lm", "ray", "matplotlib")

PROBE = """
import argparse, importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name).add_arguments(argparse.ArgumentParser())
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_importing_a_benchmark_and_building_its_parser_loads_no_heavy_module():
    modules = [module for module, _ in BENCHES.values()]
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(out.stdout))
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
