"""Traffic in Mooncake's hash-ID trace format, with its conversation workload's statistics.

Mooncake's FAST'25 release (github.com/kvcache-ai/Mooncake, FAST25-release/, Apache-2.0)
publishes `traces/conversation_trace.jsonl`: 12,031 requests sampled from one hour of a
chat service, mean input 12,035 tokens, mean output 343, one hash id per 512-token block.
Its rows are not copied here; `generate_trace` writes lines of the same format whose
statistics are the trace's, as clients.bench.memory.trace reads it (the quantiles below,
measured on that file with that module's parent rule):
- every prompt starts with one common block (a system prompt under 1,024 tokens);
- sessions: 8,056; the turns of one follow TURNS (three quarters have one turn: the
  hour is a sample, so most conversations show one request of theirs);
- a first turn's input, every output, a next turn's growth (its input minus its
  parent's input and output; a tenth shrink, dropping part of the reply) and the
  seconds from a turn to the next follow the quantile tables, interpolated;
- a next turn continues the session's latest turn, except BRANCH of them (an earlier
  turn: a regenerated or edited reply) and RESEND (the parent's prompt again, verbatim);
- sessions start uniformly over the hour.

Hash ids are what the trace's are: an id per block content and everything before it,
numbered in order of first appearance.
"""

from __future__ import annotations

import json
import random

BLOCK = 512
SYSTEM_TOKENS = 600  # block 0 is common; block 1 starts each conversation's own text
DURATION_S = 3537.0
REQUESTS = 12_031
QUANTILES = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)
FIRST_INPUT = (891, 898, 907, 1459, 5933, 14283, 26280, 38154, 87220, 120636, 126195)
OUTPUT = (1, 10, 24, 156, 350, 472, 597, 698, 1119, 2000, 2000)
GROWTH = (-1291, -18, -2, 9, 26, 384, 4363, 7238, 16805, 38891, 91467)
GAP_S = (6, 30, 42, 66, 126, 273, 480, 612, 1471, 2667, 3030)
TURNS = {1: 6044, 2: 1225, 3: 391, 4: 168, 5: 92, 6: 48, 7: 23, 8: 17, 9: 6, 10: 12}
TURNS_TAIL = (11, 12, 13, 15, 16, 19, 25, 43)  # the 52 longer sessions, spread over these
BRANCH = 0.014
RESEND = 0.022


def _sample(rng: random.Random, table) -> float:
    u = rng.random()
    for (q0, v0), (q1, v1) in zip(zip(QUANTILES, table), zip(QUANTILES[1:], table[1:])):
        if u <= q1:
            return v0 + (v1 - v0) * (u - q0) / (q1 - q0)
    return float(table[-1])


def _turns(rng: random.Random) -> int:
    counts = dict(TURNS)
    for t in TURNS_TAIL:
        counts[t] = counts.get(t, 0) + 52 // len(TURNS_TAIL)
    return rng.choices(list(counts), weights=list(counts.values()))[0]


def generate_trace(seed: int = 0, requests: int = REQUESTS, duration_s: float = DURATION_S):
    """About `requests` lines (JSON, Mooncake's format) of conversation traffic, by arrival."""
    rng = random.Random(seed)
    mean_turns = sum(k * v for k, v in TURNS.items()) / sum(TURNS.values())
    rows = []  # (timestamp ms, output length, segments)
    for s in range(max(1, round(requests / mean_turns))):
        first = max(SYSTEM_TOKENS + 1, round(_sample(rng, FIRST_INPUT)))
        segs = [("system", 0, SYSTEM_TOKENS), ((s, 0), 0, first - SYSTEM_TOKENS)]
        turns = [(segs, rng.uniform(0, duration_s), _output(rng))]
        for k in range(1, _turns(rng)):
            parent = rng.randrange(len(turns)) if rng.random() < BRANCH else len(turns) - 1
            segs, at, out = turns[parent]
            when = at + _sample(rng, GAP_S)
            if rng.random() >= RESEND:  # the parent's prompt and reply, then the new text
                base = segs + [(("reply", s, parent), 0, out)]
                size = max(SYSTEM_TOKENS + 1, _len(base) + round(_sample(rng, GROWTH)))
                segs = _cut(base, size) + [((s, k), 0, max(0, size - _len(base)))]
            turns.append(([g for g in segs if g[2] > g[1]], when, _output(rng)))
        rows += [(round(w * 1000), out, segs) for segs, w, out in turns if w <= duration_s]
    rows.sort(key=lambda r: r[0])
    ids: dict = {}
    return [
        json.dumps(
            {
                "timestamp": ts,
                "input_length": _len(segs),
                "output_length": out,
                "hash_ids": _hash_ids(segs, ids),
            }
        )
        for ts, out, segs in rows
    ]


def _output(rng: random.Random) -> int:
    return max(1, round(_sample(rng, OUTPUT)))


def _len(segs) -> int:
    return sum(b - a for _, a, b in segs)


def _cut(segs, size: int):
    """The first `size` tokens of a prompt given as (key, start, stop) segments."""
    out, n = [], 0
    for key, a, b in segs:
        if n >= size:
            break
        take = min(b - a, size - n)
        out.append((key, a, a + take))
        n += take
    return out


def _hash_ids(segs, ids: dict) -> list[int]:
    """One id per 512-token block: its content and the id before it, numbered as met."""
    out, pieces, n, prev = [], [], 0, -1
    for key, a, b in segs:
        while a < b:
            take = min(b - a, BLOCK - n)
            pieces.append((key, a, a + take))
            a, n = a + take, n + take
            if n == BLOCK:
                prev = ids.setdefault((prev, tuple(pieces)), len(ids))
                out.append(prev)
                pieces, n = [], 0
    if pieces:
        out.append(ids.setdefault((prev, tuple(pieces)), len(ids)))
    return out
