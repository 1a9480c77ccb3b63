"""StepProfile (engine.runtime.batching.step_profile): exclusive phase times, GC pauses, the
summary."""

from __future__ import annotations

import gc

import pytest

from engine.runtime.batching import step_profile
from engine.runtime.batching.step_profile import PHASES, StepProfile


class Clock:
    """A perf_counter that moves only when told."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def wait(self, ms: float) -> None:
        self.now += ms / 1000


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(step_profile, "time", fake)
    return fake


def test_phases_are_exclusive_and_the_rest_is_other(clock):
    p = StepProfile()
    p.begin()
    with p.phase("decode"):
        clock.wait(10)
        with p.phase("emit"):  # nested: pauses the decode phase
            clock.wait(20)
        clock.wait(10)
    clock.wait(15)  # outside every phase
    record = p.end(decoding=1)
    p.close()
    assert record.total_ms == pytest.approx(55)
    assert record.phases["decode"] == pytest.approx(20)
    assert record.phases["emit"] == pytest.approx(20)
    assert record.phases["other"] == pytest.approx(15)


def test_a_collection_inside_a_step_is_counted_as_gc():
    p = StepProfile()
    junk = [[i] for i in range(200_000)]  # something for the collector to walk
    p.begin()
    gc.collect()
    record = p.end(decoding=1)
    p.close()
    del junk
    assert record.phases["gc"] > 0.0
    assert p._on_gc not in gc.callbacks


def test_summary_splits_the_slowest_steps(clock):
    p = StepProfile()
    for i in range(201):
        p.begin()
        p.prefill_tokens = 4
        with p.phase("decode"):
            clock.wait(2)
        with p.phase("prefill"):
            clock.wait(9 if i in (50, 60) else 1)
        p.end(decoding=1 if i else 0)  # the first step decoded nothing: left out
    p.begin()  # a stream's first step: it decodes from the next one, no gap yet
    with p.phase("prefill"):
        clock.wait(30)
    p.end(decoding=1)
    p.close()
    s = p.summary()
    assert (s["steps"], s["total_ms_p50"], s["total_ms_max"]) == (200, 3, 11)
    assert s["slowest_1pct_ms"]["prefill"] == pytest.approx(9)  # the two 11 ms steps
    assert s["slowest_1pct_ms"]["decode"] == pytest.approx(2)
    assert s["mean_ms"]["prefill"] == pytest.approx(1.08)
    assert set(s["mean_ms"]) == set(PHASES)
    assert p.summary(since=clock.now + 1) == {"steps": 0}


def test_outside_a_step_phases_are_free():
    p = StepProfile()
    with p.phase("decode"):
        pass
    assert p.end(decoding=1) is None and not p.steps
    p.close()
