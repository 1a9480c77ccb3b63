"""Inspection of a running engine: named actors and their logs on the Ray dashboard."""

from __future__ import annotations

import time

from engine.actors.names import CACHE_MANAGER, model_actor_name


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
        actors = list_actors(filters=[("ray_namespace", "=", namespace), ("state", "=", "ALIVE")])
        return sorted(a.name for a in actors)

    assert _until(lambda: alive() == want) and alive() == want


def test_actor_log_lines_reach_the_dashboard(engine):
    from ray.util.state import get_log, list_actors

    namespace = engine.config.server.ray_namespace
    (model,) = list_actors(
        filters=[("ray_namespace", "=", namespace), ("name", "=", model_actor_name(0))]
    )

    def started() -> bool:
        return "model actor started" in "".join(get_log(actor_id=model.actor_id, suffix="err"))

    assert _until(started)
