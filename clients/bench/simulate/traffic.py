"""The simulation's traffic: the benchmarks' own traces, as token counts and prefix pieces.

A request is a prompt made of pieces (a hash and a token count each: a block of
Mooncake's trace, a message of an agent conversation) plus the tokens it
generates. Two sources, the same the live benchmarks send:
- `trace_requests`: Mooncake's conversation trace (clients.bench.memory.trace_traffic),
  scaled: the first N requests of the hour, their token counts times `scale`,
  their arrival times squeezed so the offered prefill is `load` of what the
  machine prefills (open loop: a request arrives at its time, served or not);
- `agent_requests`: `lineage bench concurrency`'s traffic (sub-agent lanes
  sharing a system prompt and tools, clients.bench.agents.traffic, plus a cold
  prompt of its own every `cold_every`-th step, the lanes' turns 150 ms after
  it); closed loop, step by step, as the bench drives it: a step starts when
  the last one ended. Messages are sized by the bench's own estimate.
It knows traces and messages; nothing of policies or costs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

COLD_STAGGER_MS = 150.0


@dataclass(frozen=True)
class SimRequest:
    key: str
    kind: str  # cold | warm
    pieces: tuple  # ((hash, tokens), ...): the prompt, in order
    output: int  # tokens it generates
    at_ms: float = 0.0  # trace: its arrival; agents: its delay after the step starts
    step: int = -1  # agents: its step (a step starts when the last one ended)

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.pieces)


def trace_requests(seed: int, requests: int, scale: float, tok_s: float, load: float) -> list:
    """The first `requests` of Mooncake's conversation hour, scaled (module doc)."""
    from clients.bench.memory.trace_traffic import BLOCK, generate_trace

    rows = [json.loads(line) for line in generate_trace(seed)][:requests]
    out = []
    for i, row in enumerate(rows):
        left, pieces = max(1, round(row["input_length"] * scale)), []
        block = max(1, round(BLOCK * scale))
        for h in row["hash_ids"]:
            if left <= 0:
                break
            pieces.append((h, min(block, left)))
            left -= block
        output = max(1, round(row["output_length"] * scale))
        out.append(SimRequest(f"t{i}", "warm", tuple(pieces), output, float(row["timestamp"])))
    # Squeeze time: the offered prefill (every prompt token, cached or not, as an upper
    # bound) at `load` of the machine's rate.
    span = max(r.at_ms for r in out) - min(r.at_ms for r in out) or 1.0
    work_ms = sum(r.tokens for r in out) / tok_s * 1000
    squeeze = work_ms / load / span
    t0 = min(r.at_ms for r in out)
    return [SimRequest(r.key, r.kind, r.pieces, r.output, (r.at_ms - t0) * squeeze) for r in out]


def _piece(value) -> tuple:
    from clients.fanout import estimate_tokens

    text = json.dumps(value, sort_keys=True)
    digest = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    return digest, max(1, estimate_tokens(text))


def agent_requests(seed: int, scale: float, agents: int, cold_every: int) -> list:
    """`lineage bench concurrency`'s traffic, step by step (module doc)."""
    from clients.bench.agents.traffic import Sessions, build_traffic
    from clients.fanout import make_system_prompt

    traffic = build_traffic(seed, scale, agents)
    sessions = Sessions(traffic)
    tools = _piece(traffic.tools)
    out = []
    for n, step in enumerate(traffic.steps()):
        if cold_every and n % cold_every == cold_every - 1:
            size = int(len(traffic.systems["main"]) / 4)
            system = make_system_prompt(size, seed=10_000 + n + 1000 * seed)
            pieces = (_piece(system), _piece(f"Summarize the rules above (batch {n})."))
            out.append(SimRequest(f"cold{n}", "cold", pieces, 8, 0.0, n))
        delay = COLD_STAGGER_MS if out and out[-1].step == n else 0.0
        for spec in step:
            messages = sessions.messages(spec)
            pieces = (tools,) + tuple(_piece(m) for m in messages)
            out.append(SimRequest(f"r{spec.rid}", "warm", pieces, spec.max_tokens, delay, n))
            sessions.record(spec, messages, "ok " * spec.max_tokens, True)
    return out
