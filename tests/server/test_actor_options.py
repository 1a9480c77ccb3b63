"""The options the engine's actors are started with, read back from their Ray handles."""

from __future__ import annotations


def test_calls_to_the_engines_actors_leave_no_task_events_in_rays_gcs(engine):
    """Ray would keep an event in its GCS for every call (the supervisor's pings, each
    request's, the stats), growing its memory for hours; the engine never reads them."""
    handles = (*engine.engine.replicas, engine.engine.manager)
    assert [h._ray_enable_task_events for h in handles] == [False] * len(handles)
