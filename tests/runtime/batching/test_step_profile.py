"""StepProfile (engine.runtime.batching.step_profile): exclusive phase times, GC pauses, the
summary; its ring of the newest KEEP steps, summarized as the deque of records was, and
allocated up front."""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from engine.runtime.batching import ring, step_profile
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


def reference_summary(records, since=0.0, until=float("inf")) -> dict:
    """The summary as the deque of StepRecords computed it (before the ring), kept here to
    compare against."""
    rows = [s for s in records if since <= s.end <= until and s.decoded and s.decoding]
    if not rows:
        return {"steps": 0}
    totals = sorted(s.total_ms for s in rows)

    def pct(q: float) -> float:
        return totals[min(len(totals) - 1, int(q / 100 * len(totals)))]

    def split(group) -> dict:
        return {k: round(sum(s.phases[k] for s in group) / len(group), 3) for k in PHASES}

    worst = sorted(rows, key=lambda s: s.total_ms)[-max(1, len(rows) // 100) :]
    return {
        "steps": len(rows),
        "total_ms_p50": round(pct(50), 3),
        "total_ms_p99": round(pct(99), 3),
        "total_ms_max": round(totals[-1], 3),
        "prefill_tokens_mean": round(sum(s.prefill_tokens for s in rows) / len(rows), 2),
        "mean_ms": split(rows),
        "slowest_1pct_ms": split(worst),
        "slowest_1pct_prefill_tokens": round(sum(s.prefill_tokens for s in worst) / len(worst), 2),
    }


def random_step(p: StepProfile, clock: Clock, rng: random.Random):
    p.begin()
    p.prefill_tokens = rng.choice((0, 0, 16, 64))
    for name in rng.sample(PHASES[:-2], 3):
        with p.phase(name):
            clock.wait(rng.choice((0.5, 1.0, 1.0, 2.5, rng.random() * 20)))  # ties and tails
    return p.end(decoding=rng.choice((0, 1, 3)))


@pytest.mark.parametrize("keep", [1, 7, 100])
def test_past_keep_steps_the_newest_keep_are_kept_in_order_and_summed_as_before(clock, keep):
    rng = random.Random(keep)
    p = StepProfile(keep=keep)
    records = [random_step(p, clock, rng) for _ in range(2 * keep + 3)]
    p.close()
    kept = records[-keep:]
    assert len(p.steps) == keep and p.last is records[-1]
    assert p.steps.ordered()["end"].tolist() == [r.end for r in kept]
    assert p.steps.ordered()["total_ms"].tolist() == [r.total_ms for r in kept]
    ends = [r.end for r in kept]
    for since, until in [
        (0.0, float("inf")),
        (ends[len(ends) // 3], ends[-1]),
        (ends[-1] + 1, 1e9),
    ]:
        assert p.summary(since, until) == reference_summary(kept, since, until)


def test_a_full_profile_of_keep_steps_summarizes_as_the_deque_did(clock):
    rng = random.Random(5)
    p = StepProfile()
    records = [random_step(p, clock, rng) for _ in range(step_profile.KEEP + 500)]
    p.close()
    kept = records[-step_profile.KEEP :]
    assert p.summary()["steps"] > step_profile.KEEP // 5
    assert p.summary() == reference_summary(kept)
    assert p.summary(kept[100].end, kept[-100].end) == reference_summary(
        kept, kept[100].end, kept[-100].end
    )


def test_the_steps_cost_their_full_size_at_construction():
    # Appending 2 * KEEP steps allocates nothing that stays: the ring was allocated (and
    # written through) when the profile was built; only `last` is replaced step by step.
    # Only what the profile's own modules hold is counted: the suite's other threads (Ray's,
    # gRPC's) allocate meanwhile, and tracemalloc traces every thread.
    tracemalloc.start()
    try:
        p = StepProfile()
        p.begin()
        p.end(decoding=1)
        built = held_by_profile(tracemalloc.take_snapshot())
        for _ in range(2 * step_profile.KEEP):
            p.begin()
            p.end(decoding=1)
        grown = held_by_profile(tracemalloc.take_snapshot()) - built
    finally:
        tracemalloc.stop()
        p.close()
    assert grown < 16 * 1024, f"{grown} bytes allocated past construction"


def held_by_profile(snapshot) -> int:
    """The traced bytes allocated in the step profile's and the ring's own code."""
    own = [tracemalloc.Filter(True, step_profile.__file__), tracemalloc.Filter(True, ring.__file__)]
    return sum(stat.size for stat in snapshot.filter_traces(own).statistics("filename"))
