"""Inspection of a running engine: named actors and their logs on the Ray dashboard."""

from __future__ import annotations

import time
from pathlib import Path

from engine.actors.names import CACHE_MANAGER, model_actor_name


def _address() -> str:
    """This session's dashboard (other Ray instances may run on the machine)."""
    import ray

    return ray.dashboard_address  # set by the ray_session fixture


def _until(check, deadline: float = 20.0, every: float = 0.25):
    """check()'s first truthy value, polled until the deadline (else its last value)."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value or time.monotonic() > end:
            return value
        time.sleep(every)


def test_actors_are_named_in_the_engine_namespace(engine):
    from ray.util.state import list_actors

    namespace = engine.config.server.ray_namespace
    want = sorted([model_actor_name(0), CACHE_MANAGER])

    def alive() -> list:
        actors = list_actors(
            address=_address(),
            filters=[("ray_namespace", "=", namespace), ("state", "=", "ALIVE")],
        )
        return sorted(a.name for a in actors)

    assert _until(lambda: alive() == want) and alive() == want


def test_actor_log_lines_reach_the_dashboard(engine):
    """The model actor's INFO lines are in its worker's .err file, the one the dashboard's
    actor page shows (read here directly: get_log needs the node agent's fixed port, which
    another Ray on the machine may hold)."""
    import ray
    from ray.util.state import list_actors

    namespace = engine.config.server.ray_namespace
    (model,) = list_actors(
        address=_address(),
        filters=[("ray_namespace", "=", namespace), ("name", "=", model_actor_name(0))],
    )
    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())

    def started() -> bool:
        text = "".join(p.read_text() for p in logs.glob(f"worker-*-{model.pid}.err"))
        return "model actor started" in text

    assert _until(started)
