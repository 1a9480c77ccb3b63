"""The prefill policy (engine.runtime.batching.prefill_policy), pure: order, aging, budget,
groups, anchors.

The executor side (decode every step, cancellation at a chunk boundary, an
anchor waiter admitted the step after the capture) runs on the real model in
tests/runtime/batching/test_chunked_prefill.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.runtime.batching.prefill_policy import (
    AGING,
    FIRST_CHUNK,
    MIN_CHUNK,
    Candidate,
    Chunk,
    Costs,
    PrefillScheduler,
)

ROOT = Path(__file__).resolve().parents[3]


def cand(
    uid, remaining, arrived=0, boundary=None, cohort=None, unblocks=None, token_ms=0.0
) -> Candidate:
    return Candidate(uid, remaining, boundary or remaining, arrived, cohort, unblocks, token_ms)


@pytest.mark.parametrize(
    "schedule, expected",
    [("srpt", (2, 3, 1)), ("fifo", (1, 2, 3))],
)
def test_order_shortest_remaining_first_or_arrival(schedule, expected):
    s = PrefillScheduler(schedule, budget=1000)
    waiting = [cand(1, 900, arrived=0), cand(2, 100, arrived=1), cand(3, 400, arrived=2)]
    order = []
    while waiting:
        chunk = s.next_chunk(waiting, step=3)
        order.append(chunk.uids[0])
        waiting = [c for c in waiting if c.uid != chunk.uids[0]]
    assert tuple(order) == expected


def test_aging_lets_a_long_prompt_beat_newcomers_in_bounded_steps():
    s = PrefillScheduler("srpt", budget=64)
    long = cand(1, 4000, arrived=0)
    steps = 4000 // AGING + 1
    # A newcomer of 50 tokens arrives every step: the long one waits, then wins.
    assert s.next_chunk([long, cand(2, 50, arrived=10)], step=10).uids == (2,)
    assert s.next_chunk([long, cand(3, 50, arrived=steps)], step=steps).uids == (1,)


def test_aging_counts_from_the_last_chunk_so_a_late_short_turn_is_not_stuck():
    s = PrefillScheduler("srpt", budget=64)
    # An old long prompt that ran a chunk last step has spent its credit: the newcomer goes.
    ran = Candidate(1, 4000, 64, arrived=0, cohort=0, waiting_since=999)
    assert s.next_chunk([ran, cand(2, 50, arrived=1000)], step=1000).uids == (2,)
    # Kept out of chunks for remaining / AGING steps, it wins again: never starved.
    wait = 4000 // AGING + 1
    assert s.next_chunk([ran, cand(3, 50, arrived=999 + wait)], step=999 + wait).uids == (1,)


@pytest.mark.parametrize(
    "remaining, own_ms, decoding, costs, expected",
    [
        # nothing decodes: a long prefill's chunk aims at slice_ms (50 ms / 0.5 ms)
        (10_000, 0.0, 0, Costs(5.0, 0.5), 100),
        (10_000, 0.0, 0, Costs(5.0, 0.0), 256),  # nothing measured: the whole budget
        (10_000, 0.0, 0, Costs(5.0, 0.01), 256),  # cheap tokens: at most the budget
        # decoding: the step aims at 2 idle steps, less what the step spends besides
        (10_000, 0.0, 2, Costs(5.0, 0.25, 5.0), 20),  # (2 * 5 - 5) / 0.25
        (10_000, 0.0, 2, Costs(5.0, 0.25, 2.0), 32),  # (2 * 5 - 2) / 0.25
        (10_000, 0.5, 2, Costs(5.0, 0.25, 5.0), 10),  # its own cohort's cost wins
        (10_000, 0.0, 2, Costs(5.0, 0.001, 5.0), 256),  # cheap tokens: at most the budget
        # the step's other work alone past the streams' budget: no chunk keeps it, so the
        # prefill keeps 1 / 2 of its rate (the bound): (2 * 0 + 3) / (2 - 1) ms
        (10_000, 0.0, 2, Costs(1.0, 1.0, 3.0), 3),
        (10_000, 0.0, 2, Costs(1.0, 10.0, 3.0), MIN_CHUNK),  # the long prompt always moves
        (10_000, 0.0, 2, Costs(0.0, 0.0), FIRST_CHUNK),  # nothing measured yet
        # short: its whole remaining prefill in one chunk when nothing decodes, or beside
        # decode when its whole cost fits the streams' gap budget; else cut to it
        (256, 2.0, 0, Costs(5.0, 1.0), (256, True)),
        (200, 0.0, 2, Costs(5.0, 0.02, 5.0), (200, True)),  # 4 ms within (2 * 5 - 5)
        (200, 0.0, 2, Costs(5.0, 1.0, 5.0), 5),  # 200 ms: one long gap for every stream
        (200, 0.0, 2, Costs(0.0, 0.0), (200, True)),  # nothing measured yet
        (257, 0.0, 2, Costs(5.0, 1.0, 5.0), 5),
    ],
)
def test_budget_in_time_and_short_prefills_whole(remaining, own_ms, decoding, costs, expected):
    s = PrefillScheduler("srpt", budget=256, step_factor=2.0, slice_ms=50.0)
    head = cand(1, remaining, token_ms=own_ms)
    chunk = s.next_chunk([head], step=0, decoding=decoding, costs=costs)
    tokens, whole = expected if isinstance(expected, tuple) else (expected, False)
    assert chunk == Chunk((1,), tokens, whole)


@pytest.mark.parametrize(
    "remaining, decoding, costs, expected",
    [
        # the chunk runs beside the decode steps, not in one: slice_ms, less the streams'
        # own decode step when they decode (they wait for a chunk run whole, then for it)
        (10_000, 2, Costs(5.0, 0.25, 5.0), 60),  # 15 ms / 0.25, not (2 * 5 - 5) / 0.25
        (10_000, 0, Costs(5.0, 0.25), 80),  # nothing decodes: the slice, 20 ms
        (10_000, 2, Costs(5.0, 0.01, 5.0), 256),  # at most the budget
        (10_000, 2, Costs(5.0, 100.0, 5.0), MIN_CHUNK),
        (10_000, 2, Costs(0.0, 0.0), FIRST_CHUNK),  # nothing measured yet beside decode
        (200, 2, Costs(5.0, 0.05, 5.0), (200, True)),  # short, within the gap: whole
        (200, 2, Costs(5.0, 0.1, 5.0), 150),  # 20 ms: past the 15 ms gap, cut to it
        (200, 2, Costs(5.0, 1.0, 5.0), 15),  # short, 200 ms: cut
        (200, 0, Costs(5.0, 1.0, 5.0), (200, True)),  # nothing decodes: whole
    ],
)
def test_with_overlap_a_chunk_aims_at_the_slice_beside_decode(remaining, decoding, costs, expected):
    s = PrefillScheduler("srpt", budget=256, step_factor=2.0, slice_ms=20.0, overlap=True)
    chunk = s.next_chunk([cand(1, remaining)], step=0, decoding=decoding, costs=costs)
    tokens, whole = expected if isinstance(expected, tuple) else (expected, False)
    assert chunk == Chunk((1,), tokens, whole)


def test_a_chunk_stops_at_the_next_capture_point():
    s = PrefillScheduler("srpt", budget=512)
    assert s.next_chunk([cand(1, 1000, boundary=300)], step=0) == Chunk((1,), 300)


def test_similar_unstarted_prompts_group_unpadded_within_the_budget():
    s = PrefillScheduler("srpt", budget=300, group=4)
    waiting = [cand(1, 200), cand(2, 260), cand(3, 900), cand(4, 250, cohort=7)]
    # 3 is not similar (900 > 1.5 * 200), 4 has started in another cohort.
    assert s.next_chunk(waiting, step=0) == Chunk((1, 2), 150, whole=True)
    one = PrefillScheduler("srpt", budget=300, group=1)
    assert one.next_chunk(waiting, step=0) == Chunk((1,), 200, whole=True)


def test_a_started_cohort_runs_whole():
    s = PrefillScheduler("srpt", budget=100)
    waiting = [cand(1, 50, cohort=0), cand(2, 400, cohort=0), cand(3, 80)]
    assert s.next_chunk(waiting, step=0) == Chunk((1, 2), 50)


def test_the_anchor_capturer_goes_first_so_waiters_start_early():
    s = PrefillScheduler("srpt", budget=512)
    waiting = [cand(1, 300), cand(2, 9000, boundary=128, unblocks=200)]
    assert s.next_chunk(waiting, step=0).uids == (2,)
    assert s.next_chunk([cand(1, 300), cand(2, 9000, boundary=128)], step=0).uids == (1,)


def test_nothing_to_prefill():
    s = PrefillScheduler("fifo", budget=8)
    assert s.next_chunk([], step=0) is None
    assert s.next_chunk([cand(1, 0)], step=0) is None


@pytest.mark.parametrize(
    "schedule, budget, group", [("batched", 8, 1), ("x", 8, 1), ("srpt", 0, 1)]
)
def test_bad_settings_are_refused(schedule, budget, group):
    with pytest.raises(ValueError):
        PrefillScheduler(schedule, budget, group)


def test_the_policy_imports_without_mlx_or_ray():
    script = (
        "import sys\n"
        "class Blocked:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('mlx', 'mlx_lm', 'ray', 'grpc'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Blocked())\n"
        "import engine.runtime.batching.prefill_policy\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'ray')]\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_the_tail_of_a_long_prompt_is_not_short():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0)
    costs = Costs(5.0, 1.0, 5.0)
    tail = Candidate(1, 200, 200, 0, cohort=0, token_ms=1.0, total=5000)
    assert s.next_chunk([tail], step=9, costs=costs) == Chunk((1,), 50)
    short = Candidate(2, 200, 200, 0, cohort=1, token_ms=1.0, total=240)
    assert s.next_chunk([short], step=9, costs=costs) == Chunk((2,), 200, whole=True)


@pytest.mark.parametrize(
    "overlap, decoding, costs, expected",
    [
        (True, 2, Costs(5.0, 0.01, 5.0), 1024),  # cheap tokens: the slice's 2000, capped
        (True, 0, Costs(5.0, 0.1), 200),  # the slice's time still sizes it
        (False, 2, Costs(5.0, 0.001, 5.0), 1024),  # beside decode in the step, too
        (True, 2, Costs(0.0, 0.0), FIRST_CHUNK),  # nothing measured yet
    ],
)
def test_a_long_prompts_chunk_is_capped_by_chunk_max_not_the_budget(
    overlap, decoding, costs, expected
):
    s = PrefillScheduler("srpt", budget=256, slice_ms=20.0, overlap=overlap, chunk_max=1024)
    assert s.next_chunk([cand(1, 10_000)], step=0, decoding=decoding, costs=costs) == Chunk(
        (1,), expected
    )
    # a prefill within the budget (and, here, the gap budget) is still short: whole
    chunk = s.next_chunk([cand(2, 256)], step=0, decoding=decoding, costs=costs)
    assert chunk == Chunk((2,), 256, whole=True)
