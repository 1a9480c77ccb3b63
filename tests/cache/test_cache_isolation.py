"""The cache policy imports neither MLX, Ray, gRPC nor the layers above it, for real.

Every module of engine.cache is imported in a fresh interpreter whose import
system refuses those packages (tests/test_layering.py checks the same rule
statically).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib, pkgutil, sys
BLOCKED = ("mlx", "mlx_lm", "ray", "grpc")
BLOCKED_ENGINE = ("engine.storage", "engine.runtime", "engine.server", "engine.actors")

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED or name.startswith(BLOCKED_ENGINE):
            raise ImportError(f"blocked import of {name}")
        return None

sys.meta_path.insert(0, Blocked())
import engine.cache.messages
import engine.cache
modules = [m.name for m in pkgutil.iter_modules(engine.cache.__path__)]
for name in modules:
    importlib.import_module(f"engine.cache.{name}")
loaded = sorted(
    m for m in sys.modules if m.split(".")[0] in BLOCKED or m.startswith(BLOCKED_ENGINE)
)
assert not loaded, loaded
print(len(modules))
"""


def test_cache_policy_imports_without_mlx_ray_grpc_or_upper_layers():
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
    assert int(result.stdout) >= 12  # every module of engine.cache was imported
