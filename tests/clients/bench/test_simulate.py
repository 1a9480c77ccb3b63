"""`lineage bench simulate`: the engine's own prefill policy driven by a cost model, against
FCFS whole prefill, on the benchmarks' traffic. Pure Python: no MLX, no clock."""

from __future__ import annotations

import argparse

from clients.bench import simulate
from clients.bench.simulate.costs import MachineCosts
from clients.bench.simulate.engine import PrefixCache, run_fcfs, run_ours
from clients.bench.simulate.traffic import SimRequest, trace_requests


def test_the_prefix_cache_restores_the_longest_stored_prefix_less_one_token():
    cache = PrefixCache()
    cache.store((("a", 100), ("b", 50)))
    assert cache.cached((("a", 100), ("c", 10))) == 100
    assert cache.cached((("a", 100), ("b", 50))) == 149  # a resend: one token to prefill
    assert cache.cached((("x", 100),)) == 0


def test_fcfs_stalls_the_streams_for_a_whole_prefill_and_ours_does_not():
    costs = MachineCosts()
    long = SimRequest("long", "cold", (("L", 8000),), 4, at_ms=1000.0)
    stream = SimRequest("s", "warm", (("S", 100),), 400, at_ms=0.0)
    fcfs = simulate.summarize(run_fcfs([stream, long], costs, False, 2048, 8))
    ours = simulate.summarize(run_ours([stream, long], costs, False))
    solo_s = costs.chunk_ms(8000) / 1000
    assert fcfs["gap_ms_p99_beside_prefill"] / 1000 > 0.9 * solo_s  # the stream waited it all
    assert ours["gap_ms_p99_beside_prefill"] / 1000 < solo_s / 10


def test_a_short_turn_behind_a_long_prompt_goes_first_under_ours():
    costs = MachineCosts()
    long = SimRequest("long", "cold", (("L", 8000),), 4, at_ms=0.0)
    short = SimRequest("short", "warm", (("S", 200),), 4, at_ms=500.0)
    firsts = {}
    for name, loop in (
        ("fcfs", run_fcfs([long, short], costs, False, 2048, 8)),
        ("ours", run_ours([long, short], costs, False)),
    ):
        firsts[name] = {s.req.key: s.first_ms - s.arrived_ms for s in loop.done}
    assert firsts["ours"]["short"] < firsts["fcfs"]["short"] / 5


def test_the_bench_runs_both_traffics_and_is_deterministic():
    parser = argparse.ArgumentParser()
    simulate.add_arguments(parser)
    args = parser.parse_args(["--scale", "0.1", "--trace-requests", "30", "--trace-scale", "0.1"])
    first, again = simulate.run_bench(args), simulate.run_bench(args)
    assert first == again
    for name in ("agents", "trace"):
        runs = first["traffic"][name]
        assert runs["ours"]["requests"] == runs["fcfs"]["requests"] > 0
    assert "ours over fcfs" in simulate.format_table(first)


def test_the_trace_is_scaled_and_squeezed_to_the_load_asked():
    requests = trace_requests(0, 50, 0.1, tok_s=420.0, load=0.5)
    work_s = sum(r.tokens for r in requests) / 420.0
    span_s = (max(r.at_ms for r in requests) - min(r.at_ms for r in requests)) / 1000
    assert abs(work_s / span_s - 0.5) < 1e-6
