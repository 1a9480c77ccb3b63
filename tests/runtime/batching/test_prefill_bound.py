"""The prefill policy's wait bound (engine.runtime.batching.prefill_policy), pure: a long
cold prompt among a stream of short ones ends its prefill (gets its first token) within
`wait_bound` times what first-come-first-served would give it, plus one chunk.

Time here is the policy's own clock (`clock`): with no cost measured, prompt tokens of
the chunks picked; with costs, their learned milliseconds. A small executor below runs
the chunks as the batch generator would: a chunk's tokens come off its sequences, a
started sequence keeps its cohort, its last chunk's step is its `waiting_since`; told
costs, it also keeps the time the chunks take.
"""

from __future__ import annotations

import pytest

from engine.runtime.batching.prefill_policy import AGING, Candidate, Costs, PrefillScheduler


def run(scheduler: PrefillScheduler, arrivals: dict, steps: int, costs: Costs = Costs()):
    """Plan `steps` steps, sequences arriving as `arrivals` says ({step: [(uid, tokens)]}):
    the uids of each step's chunk, and the clock at which each sequence's prefill ended
    (with `costs`: the time, each chunk taking its fixed cost plus its tokens' cost)."""
    live, order, ends, now = {}, [], {}, 0.0
    for step in range(steps):
        for uid, tokens in arrivals.get(step, ()):
            live[uid] = {"remaining": tokens, "arrived": step, "cohort": None, "since": None}
        waiting = [
            Candidate(
                u,
                v["remaining"],
                v["remaining"],
                v["arrived"],
                v["cohort"],
                waiting_since=v["since"],
            )
            for u, v in live.items()
        ]
        chunk = scheduler.next_chunk(waiting, step, costs=costs)
        if chunk is None:
            continue
        now += costs.fixed_ms + costs.token_ms * chunk.tokens * len(chunk.uids)
        order.append(chunk.uids[0])
        for uid in chunk.uids:
            seq = live[uid]
            seq["remaining"] -= chunk.tokens
            seq["cohort"], seq["since"] = uid, step
            if seq["remaining"] <= 0:
                del live[uid]
                ends[uid] = now if costs.token_ms else scheduler.clock
    return order, ends


def stream(long: int, short: int, steps: int, every: int = 1) -> dict:
    """A short prompt (uids from 100) every `every` steps; the long one (uid 1) at step 0,
    after the first short one."""
    arrivals = {i: [(100 + i, short)] for i in range(0, steps, every)}
    arrivals[0] = [(100, short), (1, long)]
    return arrivals


# budget 4, aging 1: a 12-token prompt (uid 1) behind one 2-token prompt (uid 100), then a
# 2-token prompt every step. First-come-first-served ends uid 1 at work 12 (it sorts first in
# its step: same arrival, lower uid); the bound X lets it end by 12 X.
@pytest.mark.parametrize(
    "bound, order, end",
    [
        # no bound: aging alone; the stream keeps it out ten steps, then again and again
        (0, [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 1, 110, 111, 112], 50),
        (1, [1, 1, 1, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110], 12),
        # shortest first while the deadline allows; then it runs, to end on its deadline
        (2, [100, 101, 102, 103, 104, 105, 1, 1, 1, 106, 107, 108, 109, 110], 24),
        (3, [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 1, 110, 111, 1, 1], 36),
    ],
)
def test_the_order_under_each_bound(bound, order, end):
    s = PrefillScheduler("srpt", budget=4, aging=1, wait_bound=bound)
    got, ends = run(s, stream(12, 2, 40), 40)
    assert got[: len(order)] == order
    assert ends[1] == end


@pytest.mark.parametrize(
    "long, short, budget, every, bound, starves",
    [
        (5000, 50, 256, 1, 2.0, True),
        (5000, 50, 256, 1, 1.5, True),
        (5000, 200, 256, 2, 2.0, False),  # the stream leaves room: aging alone is enough
        (25_000, 100, 256, 1, 3.0, True),
        (1200, 30, 64, 1, 2.0, True),
    ],
)
def test_a_long_cold_prompt_among_short_ones_ends_within_the_bound(
    long, short, budget, every, bound, starves
):
    steps = 4 * long // short
    fcfs = PrefillScheduler("fifo", budget=budget)
    _, fcfs_ends = run(fcfs, stream(long, short, steps, every), steps)
    bounded = PrefillScheduler("srpt", budget=budget, wait_bound=bound)
    _, ends = run(bounded, stream(long, short, steps, every), steps)
    assert ends[1] <= bound * fcfs_ends[1] + budget
    # Every short prompt too, each against its own first-come-first-served end.
    assert all(ends[u] <= bound * fcfs_ends[u] + budget for u in fcfs_ends if u in ends)
    # Aging alone lets the stream keep it out far longer (the bound is what holds it).
    unbounded = PrefillScheduler("srpt", budget=budget, wait_bound=0)
    _, free = run(unbounded, stream(long, short, steps, every), steps)
    assert (free.get(1, float("inf")) > bound * fcfs_ends[1] + budget) == starves


@pytest.mark.parametrize("bound", [1.1, 1.25, 2.0])
def test_the_bound_holds_in_time_where_each_chunk_has_a_fixed_cost(bound):
    # A chunk's fixed cost twice a short prompt's tokens: counted in tokens, a stream of
    # short prompts looks cheap and keeps the long one out far past its bound in time.
    costs = Costs(decode_ms=5.0, token_ms=1.0, beside_ms=5.0, fixed_ms=100.0)
    steps = 400
    fcfs = PrefillScheduler("fifo", budget=256, slice_ms=50.0)
    _, fcfs_ends = run(fcfs, stream(2000, 50, steps), steps, costs)
    bounded = PrefillScheduler("srpt", budget=256, slice_ms=50.0, wait_bound=bound)
    order, ends = run(bounded, stream(2000, 50, steps), steps, costs)
    one_chunk = costs.fixed_ms / (1 - 1 / bound)  # the bound's own chunk
    assert ends[1] <= bound * fcfs_ends[1] + one_chunk
    assert order[0] == 100  # still shortest first while the bound has room
    # Every short prompt too, each against its own first-come-first-served end.
    assert all(ends[u] <= bound * fcfs_ends[u] + one_chunk for u in fcfs_ends if u in ends)


def test_short_prompts_keep_shortest_first_while_the_bound_has_room():
    s = PrefillScheduler("srpt", budget=64, wait_bound=2.0)
    long = Candidate(1, 4000, 4000, arrived=0)
    assert s.next_chunk([long, Candidate(2, 50, 50, arrived=0)], step=0).uids == (2,)
    assert s.deadlines == {1: 2 * 4000, 2: 2 * 4050}
    assert s.clock == 50
    # Once gone, a sequence's deadline is forgotten.
    s.next_chunk([long], step=1)
    assert set(s.deadlines) == {1}


def test_aging_is_still_counted_under_the_bound():
    s = PrefillScheduler("srpt", budget=64, wait_bound=100.0)
    long = Candidate(1, 4000, 4000, arrived=0)
    steps = 4000 // AGING + 1
    assert s.next_chunk([long, Candidate(2, 50, 50, arrived=steps)], step=steps).uids == (1,)


@pytest.mark.parametrize("bound", [0.5, -1.0, 0.99])
def test_a_bound_below_one_is_refused(bound):
    with pytest.raises(ValueError, match="wait bound"):
        PrefillScheduler("srpt", budget=8, wait_bound=bound)


def test_the_setting_is_checked_where_it_is_declared():
    from engine.config.model import ModelConfig

    assert ModelConfig().prefill_wait_bound == 1.1
    with pytest.raises(ValueError, match="--prefill-wait-bound"):
        ModelConfig(prefill_wait_bound=0.5)
    assert ModelConfig(prefill_wait_bound=0).prefill_wait_bound == 0
    assert ModelConfig().prefill_chunk_max is None  # the budget
    with pytest.raises(ValueError, match="--prefill-chunk-max"):
        ModelConfig(prefill_chunk_max=0)


def test_a_machine_slowed_as_a_whole_moves_no_deadline():
    # Every cost twice as long (a load): the clock counts tokens' worth, so the same order.
    long, short = Candidate(1, 4000, 4000, arrived=0), Candidate(2, 50, 50, arrived=0)
    picks = []
    for scale in (1.0, 2.0):
        costs = Costs(5.0 * scale, 1.0 * scale, 5.0 * scale, fixed_ms=100.0 * scale)
        s = PrefillScheduler("srpt", budget=64, wait_bound=1.25)
        picks.append([s.next_chunk([long, short], 0, 2, costs), dict(s.deadlines), s.clock])
    assert picks[0] == picks[1]
