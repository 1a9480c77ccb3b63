"""Chunk sizes from learned costs (engine.runtime.batching.chunk_costs, prefill_policy), pure:
the fit of a chunk's fixed cost and cost per token, chunks that grow while nothing else waits,
and never a chunk of mostly fixed cost. Costs are injected; no clock is read."""

from __future__ import annotations

import pytest

from engine.runtime.batching.chunk_costs import ChunkCosts, TokenRate
from engine.runtime.batching.prefill_policy import (
    FIRST_CHUNK,
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


def test_once_told_apart_the_fixed_cost_stays_while_the_sizes_settle():
    # The policy sizes chunks alike once it knows the fixed cost; the decayed sums then
    # hold one size only, and forgetting the fixed cost would size the next chunk as if
    # there were none (a chunk of the gap budget alone, every ~30 chunks).
    costs = ChunkCosts()
    for tokens in (16, 64, 256, 32, 128, 512):
        costs.observe(tokens, 20.0 + 0.5 * tokens)
    for _ in range(200):
        costs.observe(160, 20.0 + 0.5 * 160)
    assert costs.fixed_ms == pytest.approx(20.0)
    assert costs.token_ms == pytest.approx(0.5)
    for _ in range(40):  # a load: the same chunks, slower; the rest of the time per token
        costs.observe(160, 2 * (20.0 + 0.5 * 160))
    assert costs.fixed_ms == pytest.approx(20.0)
    assert 1.0 < costs.token_ms <= (2 * 100.0 - 20.0) / 160  # the load: per token


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
        chunk = s.next_chunk([long(cohort=0 if step else None)], step, costs=COSTS)
        sizes.append(chunk.tokens)
    # (50 - 20) / 0.5, then 100 ms, 200 ms (the fixed 20 ms is a tenth of it), and no more
    assert sizes == [60, 160, 360, 360, 360]


def test_a_smaller_fixed_share_grows_a_lone_prefill_into_fewer_longer_chunks():
    s = PrefillScheduler(
        "srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=1024, fixed_share=0.04
    )
    sizes = [s.next_chunk([long(cohort=0 if k else None)], k, costs=COSTS).tokens for k in range(6)]
    # 100, 200, 400 ms, then 500 ms (the fixed 20 ms is a twenty-fifth of it)
    assert sizes == [60, 160, 360, 760, 960, 960]
    with pytest.raises(ValueError, match="fixed_share"):
        PrefillScheduler("srpt", budget=256, fixed_share=1.0)


@pytest.mark.parametrize("overlap", [True, False])
def test_beside_decoding_streams_a_lone_long_prefill_never_grows(overlap):
    # Alone among prefills, but streams decode: its chunk keeps to their gap budget, or
    # to the floor where that is longer, and never grows.
    s = PrefillScheduler(
        "srpt", 256, slice_ms=50.0, overlap=overlap, wait_bound=1.25, chunk_max=1024
    )
    costs = Costs(decode_ms=20.0, token_ms=0.5, beside_ms=1.0, fixed_ms=5.0)
    sizes = [
        s.next_chunk([long(cohort=0 if step else None)], step, 2, costs).tokens for step in range(5)
    ]
    # the slice less the stream's own step, or 2.5 idle steps less the step's rest
    gap = 50.0 - 20.0 if overlap else 2.5 * 20.0 - 1.0
    assert gap == s.gap_ms(2, costs) and s.floor_ms(2, costs) < gap
    assert sizes == [int((gap - 5.0) / 0.5)] * 5
    # The streams stop: growth starts (from the slice).
    after = [s.next_chunk([long(cohort=0)], step, 0, costs).tokens for step in (5, 6, 7)]
    assert after == [90, 190, 190]


@pytest.mark.parametrize("overlap", [True, False])
def test_beside_decoding_streams_a_chunk_is_their_gap_budget_or_the_floor_as_background(overlap):
    s = PrefillScheduler(
        "srpt", 256, slice_ms=50.0, overlap=overlap, wait_bound=1.25, chunk_max=1024
    )
    # Cheap forwards: the gap budget holds a chunk the fixed cost is a small part of.
    cheap = Costs(decode_ms=20.0, token_ms=0.5, beside_ms=1.0, fixed_ms=2.0)
    gap = s.gap_ms(3, cheap)  # the slice less a step (30), or 2.5 idle steps less the rest (49)
    assert s.floor_ms(3, cheap) < gap
    chunk = s.next_chunk([long()], 0, decoding=3, costs=cheap)
    assert chunk.tokens == int((gap - cheap.fixed_ms) / cheap.token_ms)
    assert not chunk.background  # the streams may wait for it whole
    # A fixed cost that would be most of a chunk of the budget: never shrink below what it
    # pays for. The chunk keeps the prefill at 1 / 1.25 of its rate, as background work.
    costs = Costs(decode_ms=20.0, token_ms=0.5, beside_ms=1.0, fixed_ms=20.0)
    floor = s.floor_ms(3, costs)  # (1.25 x 20 + the step's rest) / 0.25
    assert floor == (100.0 if overlap else 104.0) and floor > s.gap_ms(3, costs)
    chunk = s.next_chunk([long()], 1, decoding=3, costs=costs)
    assert chunk.tokens == int((floor - 20.0) / 0.5) and chunk.background
    other = 0.0 if overlap else costs.beside_ms
    useful = chunk.tokens * costs.token_ms
    assert useful / (useful + costs.fixed_ms + other) == pytest.approx(1 / 1.25, abs=0.01)
    # A short turn whose whole cost fits the floor's time runs whole, as background; one
    # longer is cut like any chunk.
    fits = Candidate(2, 150, 150, arrived=1)  # 20 + 75 ms
    chunk = s.next_chunk([fits], 2, decoding=3, costs=costs)
    assert chunk == Chunk((2,), 150, whole=True) and chunk.background
    longer = Candidate(3, 250, 250, arrived=2)
    chunk = s.next_chunk([longer], 3, decoding=3, costs=costs)
    assert (chunk.tokens, chunk.whole) == (int((floor - 20.0) / 0.5), False)
    # Nothing decodes: it runs whole (its first token is all that waits), not background.
    chunk = s.next_chunk([longer], 4, decoding=0, costs=costs)
    assert chunk == Chunk((3,), 250, whole=True) and not chunk.background


def test_a_waiting_short_turn_cuts_the_chunk_back_to_the_slice_and_growth_starts_over():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=1024)
    for step in range(3):
        s.next_chunk([long(cohort=0 if step else None)], step, costs=COSTS)
    short = Candidate(2, 500, 500, arrived=3)  # a warm turn longer than the budget
    chunk = s.next_chunk([long(cohort=0), short], 3, costs=COSTS)
    assert chunk == Chunk((2,), 60)  # the short one first, in a slice
    chunk = s.next_chunk([long(cohort=0), short], 4, costs=COSTS)
    assert chunk.tokens == 60  # someone else still waits: the slice
    after = [s.next_chunk([long(cohort=0)], step, costs=COSTS).tokens for step in (5, 6)]
    assert after == [60, 160]


def test_never_a_chunk_of_mostly_fixed_cost_even_with_a_turn_waiting():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=1024)
    costs = Costs(10.0, 0.5, 10.0, fixed_ms=40.0)
    chunk = s.next_chunk(
        [long(), Candidate(2, 5_000, 5_000, arrived=1)], 1, decoding=2, costs=costs
    )
    assert chunk.tokens == 80  # 80 ms (twice the fixed cost), not 50: (80 - 40) / 0.5


def test_unknown_fixed_cost_still_grows_to_twice_the_slice_so_sizes_vary_for_the_fit():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=1024)
    costs = Costs(10.0, 0.5, 10.0)  # fixed 0: not told apart yet
    sizes = [s.next_chunk([long()], step, costs=costs).tokens for step in range(4)]
    assert sizes == [100, 200, 200, 200]


def test_a_chunk_inside_a_decode_step_never_grows():
    s = PrefillScheduler("srpt", budget=256, step_factor=3.0, overlap=False)
    sizes = [s.next_chunk([long()], step, decoding=2, costs=COSTS).tokens for step in range(4)]
    assert len(set(sizes)) == 1  # (3 * 10 - 10) ms each: the streams' gaps


def test_nothing_decoding_grows_too_and_chunk_max_caps_the_growth():
    s = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True, chunk_max=200)
    sizes = [s.next_chunk([long()], step, decoding=0, costs=COSTS).tokens for step in range(4)]
    assert sizes == [60, 160, 200, 200]
    default = PrefillScheduler("srpt", budget=256, slice_ms=50.0, overlap=True)
    cheap = Costs(10.0, 0.01, 10.0, fixed_ms=20.0)  # 200 ms would be 18,000 tokens
    sizes = [
        default.next_chunk([long()], step, decoding=0, costs=cheap).tokens for step in range(3)
    ]
    assert sizes == [256, 256, 256]  # chunk_max defaults to the budget


MAC = Costs(decode_ms=33.0, token_ms=1000 / 420, beside_ms=33.0, fixed_ms=130.0)


def test_beside_decode_a_fixed_cost_beyond_the_gap_budget_keeps_the_prefill_rate():
    # A forward's fixed cost several decode steps long (a Mac's): no chunk mostly of useful
    # work fits the streams' gap budget (2.5 idle steps, 49.5 ms), so the chunk keeps the
    # prefill at 1 / 1.25 of its rate: (1.25 * 130 + 33) / 0.25 = 782 ms a step.
    s = PrefillScheduler("srpt", 256, step_factor=2.5, wait_bound=1.25, chunk_max=4096)
    chunk = s.next_chunk([long()], 0, decoding=2, costs=MAC)
    assert chunk.tokens == int((782.0 - 130.0) / MAC.token_ms)
    useful = chunk.tokens * MAC.token_ms
    assert useful / (useful + MAC.fixed_ms + MAC.beside_ms) == pytest.approx(1 / 1.25, abs=0.01)


def test_when_the_bound_presses_its_chunks_are_the_largest_and_it_holds_in_time():
    # The floor's chunks (180 ms with the step's 20 and the fixed 20) keep the prefill at
    # 80% of its rate; where the bound presses, its chunks are chunk_max tokens, the size
    # its deadline was priced at. Alone, the prefill ends within 1.25 x its
    # first-come-first-served time (fixed costs and decode steps counted).
    costs = Costs(decode_ms=40.0, token_ms=0.5, beside_ms=20.0, fixed_ms=20.0)
    s = PrefillScheduler("srpt", 256, step_factor=2.5, wait_bound=1.25, chunk_max=4096)
    left, sizes = 20_000, []
    for step in range(10_000):
        if left <= 0:
            break
        chunk = s.next_chunk([long(remaining=left, cohort=0 if step else None)], step, 2, costs)
        sizes.append(chunk.tokens)
        left -= chunk.tokens
    floor = int((s.floor_ms(2, costs) - 20) / 0.5)  # longer than the gap budget's 120
    assert sizes[0] == floor == 320  # while the bound has room: the floor's chunk
    assert set(sizes[:-1]) <= {floor, 4096}
    fcfs = 20_000 * costs.token_ms + (costs.fixed_ms + costs.beside_ms) * 5  # 4096 a forward
    assert s.clock * costs.token_ms <= 1.25 * fcfs  # (the clock counts tokens' worth)


def test_until_the_fixed_cost_is_known_the_gap_target_alone_sizes_the_chunk():
    # (a bound that does not press: at 1.25 the decode steps beside would press it)
    s = PrefillScheduler("srpt", 256, step_factor=2.5, wait_bound=3.0, chunk_max=4096)
    costs = Costs(33.0, 1000 / 420, 33.0)
    assert s.next_chunk([long()], 0, decoding=2, costs=costs).tokens == int(49.5 / costs.token_ms)


def test_slow_chunks_never_make_the_fixed_cost_more_than_the_fastest_chunk():
    # A loaded machine: two small chunks ran slow, and the line through the chunks crosses
    # 0 tokens at 86 ms, far above what the first small chunk was seen to cost.
    costs = ChunkCosts()
    for tokens, ms in ((10, 12.0), (20, 150.0), (30, 160.0), (200, 300.0), (250, 350.0)):
        costs.observe(tokens, ms)
    assert 0 < costs.fixed_ms <= 12.0
    mean_tokens, mean_ms = costs.x / costs.w, costs.y / costs.w
    assert costs.fixed_ms + costs.token_ms * mean_tokens == pytest.approx(mean_ms)


def test_a_one_token_chunk_slowed_by_a_load_spike_weighs_one_token():
    # Sizing on a mean of ratios let such a chunk set the rate (0.7 * 3 + 0.3 * 130 ms),
    # so the next chunks shrank to one token, whose noise set it again.
    rate = TokenRate()
    rate.observe(100, 300.0)  # 3 ms a token
    rate.observe(1, 130.0)
    assert rate.token_ms == pytest.approx((0.7 * 300.0 + 130.0) / (0.7 * 100 + 1))
    assert rate.token_ms < 5.0
    assert TokenRate().token_ms == 0.0  # nothing seen


def test_beside_decode_chunk_sizes_vary_until_the_fit_tells_the_fixed_cost_apart():
    # A fixed cost (40 ms) near the slice (25 ms): each chunk's time read as per-token cost
    # would shrink the chunks to one token for good (one size: the fit never separates
    # them). Every other chunk is half the size (two tokens for one) until it does; then
    # the slice holds no useful chunk and the floor sizes them.
    s = PrefillScheduler("srpt", 256, slice_ms=25.0, overlap=True, wait_bound=1.25)
    fit, rate, sizes, left = ChunkCosts(), TokenRate(), [], 100_000
    for step in range(40):
        costs = Costs(10.0, rate.token_ms, 10.0, fit.fixed_ms)
        chunk = s.next_chunk([long(remaining=left, cohort=0 if step else None)], step, 3, costs)
        ms = 40.0 + 1.0 * chunk.tokens
        fit.observe(chunk.tokens, ms)
        rate.observe(chunk.tokens, max(ms - fit.fixed_ms, ms * 0.1))
        sizes.append(chunk.tokens)
        left -= chunk.tokens
    assert fit.fixed_ms == pytest.approx(40.0)
    floor = (1.25 * 40.0 / 0.25 - 40.0) / 1.0  # 160 tokens (the rate read still settling)
    assert 0.9 * floor <= min(sizes[-10:]) <= max(sizes[-10:]) <= floor


def test_only_a_chunk_longer_than_the_streams_gap_budget_is_background_work():
    s = PrefillScheduler("srpt", 256, slice_ms=50.0, overlap=True, wait_bound=0, chunk_max=4096)
    fits = Costs(decode_ms=10.0, token_ms=0.5, beside_ms=10.0, fixed_ms=5.0)
    chunk = s.next_chunk([long()], 0, decoding=2, costs=fits)
    # 40 ms, the slice less the streams' own step: they may wait for it
    assert chunk.tokens == 70 and not chunk.background
    heavy = Costs(decode_ms=10.0, token_ms=0.5, beside_ms=10.0, fixed_ms=40.0)
    chunk = s.next_chunk([long()], 1, decoding=2, costs=heavy)
    assert chunk.tokens == 80 and chunk.background  # the floor's 80 ms
    short = Candidate(2, 200, 200, arrived=2)
    assert not s.next_chunk([short], 2, decoding=2, costs=Costs(10.0, 0.1, 10.0, 5.0)).background
    assert not s.next_chunk([long()], 3, decoding=0, costs=heavy).background  # nobody waits
    unknown = s.next_chunk([long()], 4, decoding=2, costs=Costs(10.0, 0.0, 10.0))
    assert unknown.tokens == FIRST_CHUNK and unknown.background  # no cost known: as it goes


def test_a_background_chunk_is_worth_its_own_fixed_cost():
    # Evaluated module by module, a background chunk pays more fixed cost than one evaluated
    # whole (on the CPU 34.5 ms against 8): its floor is priced at its own, so it keeps the
    # prefill at 1 / 1.25 of its rate; priced at the whole forward's it would be half fixed.
    # (Background chunks run on the worker: with overlap.)
    s = PrefillScheduler("srpt", 256, slice_ms=50.0, overlap=True, wait_bound=1.25, chunk_max=1024)
    costs = Costs(decode_ms=20.0, token_ms=0.5, beside_ms=1.0, fixed_ms=8.0)
    costs = Costs(**{**costs.__dict__, "background_fixed_ms": 34.5})
    assert s.floor_ms(3, costs) > s.gap_ms(3, costs)  # a chunk worth 8 ms is background
    chunk = s.next_chunk([long()], 0, decoding=3, costs=costs)
    assert chunk.background
    useful = chunk.tokens * costs.token_ms
    assert useful / (useful + 34.5) == pytest.approx(1 / 1.25, abs=0.01)
    # Within the gap budget a chunk is evaluated whole: the whole forward's fixed cost.
    cheap = Costs(20.0, 0.5, 1.0, fixed_ms=2.0, background_fixed_ms=34.5)
    chunk = s.next_chunk([long()], 1, decoding=3, costs=cheap)
    assert not chunk.background
    assert chunk.tokens == int((s.gap_ms(3, cheap) - 2.0) / 0.5)
    # Nothing decoding: no chunk is background, the whole forward's cost sizes it.
    assert s.room(0, costs) == (50.0, 8.0, False)
    # Not told apart yet (0), every other background chunk is half size, for the fit.
    unknown = Costs(20.0, 0.5, 1.0, fixed_ms=8.0, background_fixed_ms=0.0)
    sizes = [s.next_chunk([long()], step, 3, unknown).tokens for step in (2, 3)]
    assert min(sizes) * 2 in (max(sizes), max(sizes) + 1)
    # Where background chunks run as whole ones do (a GPU), one fixed cost prices both.
    same = Costs(20.0, 0.5, 1.0, fixed_ms=8.0)
    assert same.fixed(True) == same.fixed(False) == 8.0


def test_a_background_chunk_nobody_else_waits_for_grows_beside_the_streams():
    # Evaluated module by module, it leaves the streams the machine whatever its length:
    # alone, it doubles from the floor until its fixed cost is a tenth of it.
    s = PrefillScheduler("srpt", 256, slice_ms=50.0, overlap=True, wait_bound=1.25, chunk_max=4096)
    costs = Costs(20.0, 0.5, 1.0, fixed_ms=8.0, background_fixed_ms=34.5)
    floor = s.floor_ms(3, costs, 34.5)  # 172.5 ms
    sizes = [s.next_chunk([long(cohort=0)], step, 3, costs).tokens for step in range(4)]
    grown = int((34.5 / 0.1 - 34.5) / 0.5)  # to a tenth fixed: 345 ms
    assert sizes == [int((floor - 34.5) / 0.5), grown, grown, grown]
    # A newcomer cuts it back to the floor: it would wait for the chunk in flight.
    newcomer = Candidate(2, 5000, 5000, arrived=4)
    chunk = s.next_chunk([long(cohort=0), newcomer], 4, 3, costs)
    assert chunk.tokens == int((floor - 34.5) / 0.5) and chunk.background
    # Where a background chunk runs as a whole forward (a GPU, `--prefill-eval forward`),
    # the streams wait for it whole: beside them it never grows.
    s = PrefillScheduler("srpt", 256, slice_ms=50.0, overlap=True, wait_bound=1.25, chunk_max=4096)
    whole = Costs(20.0, 0.5, 1.0, fixed_ms=34.5)
    sizes = [s.next_chunk([long(cohort=0)], step, 3, whole).tokens for step in range(4)]
    assert len(set(sizes)) == 1
