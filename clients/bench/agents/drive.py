"""How `lineage bench agents` runs its traffic against one policy: step by step, in order.

`drive` builds each step's messages from the sessions so far (clients.bench.agents.traffic),
renders their prompt ids (the caller's `ids.encode`), hands the step to the
policy's `serve` and records what came back (clients.bench.agents.observed). It knows
no engine, server or wire format: `serve` does.
"""

from __future__ import annotations

import time

from clients.bench.agents.observed import PolicyRun
from clients.bench.agents.traffic import Sessions, Traffic


def drive(name: str, traffic: Traffic, ids, serve, sample) -> PolicyRun:
    """Run the traffic step by step: `serve(batch)` yields (Observed, reply text) per request
    of the step, in order; `sample()` gives the cache figures after each step."""
    out = PolicyRun(name)
    sessions = Sessions(traffic)
    t0 = time.perf_counter()
    for step in traffic.steps():
        batch = []
        for spec in step:
            messages = sessions.messages(spec)
            batch.append((spec, messages, ids.encode(messages, traffic.tools)))
        for (spec, messages, _), (ob, text) in zip(batch, serve(batch)):
            sessions.record(spec, messages, text, ob.completed)
            out.observed.append(ob)
        out.stats.append(sample())
    out.wall_s = time.perf_counter() - t0
    out.evictions = out.stats[-1]["evictions"] if out.stats else 0
    return out
