"""`lineage bench memory`'s trace replay: reading hash-ID traces, sessions, the oracle.

Plain Python and numpy: the replay drives the pure cache policy, no MLX, no Ray.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from clients.bench.memory.trace import read_trace, trace_sessions, trace_turns
from clients.bench.memory.trace_traffic import generate_trace
from engine.config.cache import CacheConfig

MiB = 1 << 20


def line(ts, inp, out, ids, **extra) -> str:
    row = {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids}
    return json.dumps(row | extra)


def test_reads_both_formats_by_arrival():
    lines = [
        line(3000, 700, 5, [0, 2]),
        "",
        line(1000, 1024, 50, [0, 1]),
        line(2.5, 20, 3, [7, 8], chat_id=4, parent_chat_id=-1, turn=1, type="text"),
        line(9.0, 40, 3, [7, 8, 9], chat_id=5, parent_chat_id=4, turn=2, type="text"),
    ]
    reqs = read_trace(lines)
    assert [r.timestamp for r in reqs] == [2.5, 9.0, 1000, 3000]
    assert reqs[2].hash_ids == (0, 1) and reqs[2].input_length == 1024
    assert (reqs[0].chat_id, reqs[0].parent_chat_id) == (4, None)
    assert (reqs[1].chat_id, reqs[1].parent_chat_id) == (5, 4)
    with pytest.raises(ValueError, match="trace line 2"):
        read_trace([lines[0], '{"timestamp": 1, "hash_ids": [1]}'])
    with pytest.raises(ValueError, match="input_length 0"):
        read_trace([line(0, 0, 1, [1])])


# Block 0 is every request's system block; request 1 continues request 0 (it holds its
# whole blocks 0, 1); request 2 shares the system block only; request 3 resends 1. Forty
# later requests of one turn each make block 0 the only one a tenth of them hold.
TRACE = [
    line(0, 1210, 100, [0, 1, 2]),
    line(1, 2010, 10, [0, 1, 3, 4]),
    line(2, 900, 10, [0, 5]),
    line(3, 2010, 10, [0, 1, 3, 4]),
] + [line(10 + k, 600, 10, [0, 100 + k]) for k in range(40)]


def test_sessions_tokens_and_oracle():
    reqs = read_trace(TRACE)
    t = trace_turns(reqs, trace_block=512, block=16)
    assert [x.session for x in t[:4]] == [0, 0, 2, 0]
    assert [x.parent for x in t[:4]] == [None, 0, None, 1]
    assert [len(x.prompt) for x in t[:4]] == [16 * 2 + 6, 16 * 3 + 15, 16 + 12, 63]
    assert all(x.anchor == 16 for x in t)
    # The next turn carries its parent's partial block and reply, token for token.
    carried = np.concatenate([t[0].prompt, t[0].reply])
    assert len(t[0].reply) == 3
    assert np.array_equal(t[1].prompt[: len(carried)], carried)
    assert t[1].starts == (16, len(t[0].prompt), len(carried))
    assert t[1].roles == ("user", "assistant", "user")
    # Oracle: the longest prefix an earlier prompt or reply shares.
    assert [x.oracle for x in t[:4]] == [0, len(carried), 16, 63]
    assert np.array_equal(t[3].prompt, t[1].prompt)
    with pytest.raises(ValueError, match="block 600"):
        trace_turns(reqs, trace_block=512, block=600)


def test_generated_trace_keeps_the_published_shape():
    reqs = read_trace(generate_trace(seed=1, requests=400))
    assert 300 < len(reqs) < 500
    assert all(r.hash_ids[0] == 0 for r in reqs)  # one system block for all
    mean_in = sum(r.input_length for r in reqs) / len(reqs)
    assert 6_000 < mean_in < 20_000
    for r in reqs:
        assert (len(r.hash_ids) - 1) * 512 < r.input_length <= len(r.hash_ids) * 512
    t = trace_turns(reqs, 512, 16)
    assert len({x.session for x in t}) < len(t)  # some sessions return


def test_replay_figures_move_with_the_budget():
    lines = generate_trace(seed=2, requests=300)
    states = {"baseline": (64 * MiB, False), "default": (32 * MiB, True)}
    big = trace_sessions(CacheConfig(), 24 << 10, states, 1 << 40, lines, block=16)
    small = trace_sessions(CacheConfig(), 24 << 10, states, 2 << 30, lines, block=16)
    assert big["trace"]["returning_sessions"] > 0
    for name in states:
        assert big[name]["oracle_tokens"] == small[name]["oracle_tokens"] > 0
        assert big[name]["share_of_oracle"] > 0.9
        assert big[name]["warm_returning_sessions"] > small[name]["warm_returning_sessions"]
        assert small[name]["restored_tokens"] < big[name]["restored_tokens"]
