"""The cache policy imports neither MLX nor Ray (STYLE point 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import importlib, pkgutil, sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mlx", "ray"):
            raise ImportError(f"blocked import of {name}")
        return None

sys.meta_path.insert(0, Blocked())
import engine.messages
import engine.cache
modules = [m.name for m in pkgutil.iter_modules(engine.cache.__path__)]
for name in modules:
    importlib.import_module(f"engine.cache.{name}")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("mlx", "ray"))
assert not loaded, loaded
print(len(modules))
"""


def test_cache_policy_imports_without_mlx_and_ray():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 9  # every module of engine.cache was imported
