"""Mooncake's conversation trace as live traffic: `lineage bench concurrency --traffic trace`.

The conversation hour (clients.bench.memory.trace_traffic: Mooncake's format, one hash
id per 512-token block), one conversation in `every` with all its turns (a conversation:
the requests whose first own block, block 1, is the same), its first `requests`, token
counts times `scale`. Each
block is text seeded by its hash id (clients.fanout.make_system_prompt), so requests
that share leading blocks share their text: block 0, common to every prompt, is the
system message, the rest the user message. Arrivals keep the trace's order and gaps,
squeezed into `span_s` seconds, open loop (a request is sent at its time, whatever is
still running); replies are at most `max_tokens`. A request is `cold` when no earlier
one shares more than block 0 with it: the first turn of a conversation.

It knows the trace and the messages; nothing of senders or figures.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

THREADS = 16  # requests in flight at most (the rest wait for a thread, as a client's pool)


@dataclass(frozen=True)
class TraceRequest:
    key: str
    kind: str  # cold | warm
    at_s: float  # its send time from the replay's start
    messages: tuple
    max_tokens: int
    tokens: int  # its prompt's tokens, as the trace counts them


class TraceTraffic:
    """The scaled trace's requests (module doc) and how to replay them."""

    def __init__(
        self, seed: int, requests: int, scale: float, span_s: float, max_tokens: int, every: int
    ):
        from clients.bench.memory.trace_traffic import BLOCK, generate_trace
        from clients.fanout import make_system_prompt

        rows = [json.loads(line) for line in generate_trace(seed)]
        rows = [r for r in rows if len(r["hash_ids"]) > 1 and r["hash_ids"][1] % every == 0]
        rows = rows[:requests]
        block = max(1, round(BLOCK * scale))
        t0 = rows[0]["timestamp"]
        stretch = span_s * 1000 / max(1, rows[-1]["timestamp"] - t0)
        seen: set = set()
        self.requests: list[TraceRequest] = []
        self.scale, self.span_s, self.every = scale, span_s, every
        for i, row in enumerate(rows):
            ids = row["hash_ids"]
            left = max(1, round(row["input_length"] * scale))
            texts = []
            for h in ids:
                if left <= 0:
                    break
                texts.append(make_system_prompt(min(block, left), seed=h))
                left -= block
            kind = "warm" if any(h in seen for h in ids[1:]) else "cold"
            seen.update(ids)
            messages = ({"role": "system", "content": texts[0]},) + (
                ({"role": "user", "content": "\n".join(texts[1:])},) if texts[1:] else ()
            )
            output = max(1, min(max_tokens, round(row["output_length"] * scale)))
            at = (row["timestamp"] - t0) * stretch / 1000
            tokens = min(row["input_length"], len(ids) * BLOCK)
            self.requests.append(
                TraceRequest(f"t{i}", kind, at, messages, output, round(tokens * scale))
            )

    def summary(self) -> dict:
        return {
            "traffic": "Mooncake conversation trace (clients.bench.memory.trace_traffic), scaled",
            "requests": len(self.requests),
            "cold": sum(r.kind == "cold" for r in self.requests),
            "scale": self.scale,
            "one_conversation_in": self.every,
            "span_s": self.span_s,
            "prompt_tokens": sum(r.tokens for r in self.requests),
        }

    def drive(self, sender, solo: bool) -> list:
        """Each request at its time (open loop), or one after another when `solo`."""
        if solo:
            return [self._send(sender, r) for r in self.requests]
        start, futures = time.perf_counter(), []
        with ThreadPoolExecutor(THREADS) as pool:
            for r in self.requests:
                time.sleep(max(0.0, start + r.at_s - time.perf_counter()))
                futures.append(pool.submit(self._send, sender, r))
            return [f.result() for f in futures]

    @staticmethod
    def _send(sender, r: TraceRequest):
        # One namespace for all: a conversation's next turn restores its first.
        return sender.send(
            r.key, r.kind, messages=list(r.messages), max_tokens=r.max_tokens, namespace=""
        )
