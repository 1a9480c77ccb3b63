"""What the actors are called on the Ray dashboard, and where their log lines go.

The engine's actors are named in one Ray namespace (`ServerConfig.ray_namespace`,
"lineage" by default): `lineage-model-<replica>` and `lineage-cache-manager`,
so the dashboard, `ray list actors` and `ray.get_actor` find them by name. A
Ray worker's root logger has no handler, so an actor's INFO lines would be
lost: `log_to_stderr()` sends the engine's loggers to the worker's stderr
file, which the dashboard's actor page shows under its logs.
"""

from __future__ import annotations

import logging
import sys

CACHE_MANAGER = "lineage-cache-manager"
LOG_FORMAT = "%(asctime)s %(name)s %(message)s"


def model_actor_name(replica: int | str) -> str:
    """The Ray name of model replica `replica`."""
    return f"lineage-model-{replica}"


def log_to_stderr(*loggers: str) -> None:
    """INFO lines of these loggers (default: the engine's) to stderr, once per process."""
    for name in loggers or ("engine", "lineage"):
        logger = logging.getLogger(name)
        if any(getattr(h, "_lineage", False) for h in logger.handlers):
            continue
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler._lineage = True
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
