"""Chunk sizes from learned costs (engine.runtime.batching.chunk_costs, prefill_policy), pure:
the fit of a chunk's fixed cost and cost per token, chunks that grow while nothing else waits,
and never a chunk of mostly fixed cost. Costs are injected; no clock is read."""

from __future__ import annotations

import pytest

from engine.runtime.batching.chunk_costs import ChunkCosts
from engine.runtime.batching.prefill_policy import (
    Candidate,
    Chunk,
    Costs,
    PrefillScheduler,
)


def test_the_fit_tells_the_fixed_cost_from_the_cost_per_token():
    costs = ChunkCosts()
    for tokens in (16, 64, 256, 32, 128, 512):
        costs.observe(tokens, 20.0 + 0.5 * tokens)
    assert costs.fixed_ms == pytest.approx(20.0)
    assert costs.token_ms == pytest.approx(0.5)


def test_chunks_of_one_size_cannot_tell_them_apart_so_the_ratio_stands():
    costs = ChunkCosts()
    for _ in range(8):
        costs.observe(100, 70.0)
    assert costs.fixed_ms == 0.0
    assert costs.token_ms == pytest.approx(0.7)


def test_the_fit_follows_costs_that_change():
    costs = ChunkCosts()
    for tokens in (16, 64, 256, 32, 128, 512) * 2:
        costs.observe(tokens, 20.0 + 0.5 * tokens)
    for tokens in (16, 64, 256, 32, 128, 512) * 20:  # another machine's costs, or a load
        costs.observe(tokens, 5.0 + 2.0 * tokens)
    assert costs.fixed_ms == pytest.approx(5.0, abs=1.0)
    assert costs.token_ms == pytest.approx(2.0, abs=0.05)


def test_nonsense_is_ignored():
    costs = ChunkCosts()
    costs.observe(0, 10.0)
    costs.observe(10, 0.0)
    assert (costs.fixed_ms, costs.token_ms) == (0.0, 0.0)


LONG = 100_000
COSTS = Costs(decode_ms=10.0, token_ms=0.5, beside_ms=10.0, fixed_ms=20.0)


def long(uid=1, arrived=0, remaining=LONG, cohort=None):
    return Candidate(uid, remaining, remaining, arrived, cohort=cohort)


def test_a_long_prefill_alone_doubles_its_chunk_until_the_fixed_cost_is_a_tenth():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=1024)
    sizes = []
    for step in range(5):
        chunk = s.plan([long(cohort=0 if step else None)], step, decoding=2, costs=COSTS)
        sizes.append(chunk.tokens)
    # (50 - 20) / 0.5, then 100 ms, 200 ms (the fixed 20 ms is a tenth of it), and no more
    assert sizes == [60, 160, 360, 360, 360]


def test_a_waiting_short_turn_cuts_the_chunk_back_to_the_slice_and_growth_starts_over():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=1024)
    for step in range(3):
        s.plan([long(cohort=0 if step else None)], step, decoding=2, costs=COSTS)
    short = Candidate(2, 500, 500, arrived=3)  # a warm turn longer than the budget
    chunk = s.plan([long(cohort=0), short], 3, decoding=2, costs=COSTS)
    assert chunk == Chunk((2,), 60)  # the short one first, in a slice
    chunk = s.plan([long(cohort=0), short], 4, decoding=2, costs=COSTS)
    assert chunk.tokens == 60  # someone else still waits: the slice
    after = [s.plan([long(cohort=0)], step, decoding=2, costs=COSTS).tokens for step in (5, 6)]
    assert after == [60, 160]


def test_never_a_chunk_of_mostly_fixed_cost_even_with_a_turn_waiting():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=1024)
    costs = Costs(10.0, 0.5, 10.0, fixed_ms=40.0)
    chunk = s.plan([long(), Candidate(2, 5_000, 5_000, arrived=1)], 1, decoding=2, costs=costs)
    assert chunk.tokens == 80  # 80 ms (twice the fixed cost), not 50: (80 - 40) / 0.5


def test_unknown_fixed_cost_still_grows_to_twice_the_slice_so_sizes_vary_for_the_fit():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=1024)
    costs = Costs(10.0, 0.5, 10.0)  # fixed 0: not told apart yet
    sizes = [s.plan([long()], step, decoding=2, costs=costs).tokens for step in range(4)]
    assert sizes == [100, 200, 200, 200]


def test_a_chunk_inside_a_decode_step_never_grows():
    s = PrefillScheduler("srpt", budget=256, step_factor=3.0, overlap=False)
    sizes = [s.plan([long()], step, decoding=2, costs=COSTS).tokens for step in range(4)]
    assert len(set(sizes)) == 1  # (3 * 10 - 10) ms each: the streams' gaps


def test_nothing_decoding_grows_too_and_chunk_max_caps_the_growth():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=200)
    sizes = [s.plan([long()], step, decoding=0, costs=COSTS).tokens for step in range(4)]
    assert sizes == [60, 160, 200, 200]
    default = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True)
    cheap = Costs(10.0, 0.01, 10.0, fixed_ms=20.0)  # 200 ms would be 18,000 tokens
    sizes = [default.plan([long()], step, decoding=0, costs=cheap).tokens for step in range(3)]
    assert sizes == [256, 256, 256]  # chunk_max defaults to the budget


MAC = Costs(decode_ms=33.0, token_ms=1000 / 420, beside_ms=33.0, fixed_ms=130.0)


def test_beside_decode_a_chunk_keeps_the_prefill_within_the_wait_bound_of_its_own_rate():
    # A forward's fixed cost several decode steps long (a Mac's): the streams' gap target
    # (2.5 idle steps) would leave the prefill a third of its rate; the chunk is sized so the
    # prefill keeps 1 / 1.25 of it: (1.25 * 130 + 33) / 0.25 = 782 ms a step.
    s = PrefillScheduler("srpt", 256, step_factor=2.5, wait_bound=1.25, chunk_max=4096)
    chunk = s.plan([long()], 0, decoding=2, costs=MAC)
    assert chunk.tokens == int((782.0 - 130.0) / MAC.token_ms)
    useful = chunk.tokens * MAC.token_ms
    assert useful / (useful + MAC.fixed_ms + MAC.beside_ms) == pytest.approx(1 / 1.25, abs=0.01)


def test_until_the_fixed_cost_is_known_the_gap_target_alone_sizes_the_chunk():
    s = PrefillScheduler("srpt", 256, step_factor=2.5, wait_bound=1.25, chunk_max=4096)
    costs = Costs(33.0, 1000 / 420, 33.0)
    assert s.plan([long()], 0, decoding=2, costs=costs).tokens == int(49.5 / costs.token_ms)
