"""Warm sessions on a public hash-ID trace, replayed through the cache policy.

A hash-ID trace (Mooncake's FAST'25 release, kvcache-ai/Mooncake FAST25-release/traces;
Qwen-Bailian's, alibaba-edu/qwen-bailian-usagetraces-anon) holds per request its arrival
time, its input and output lengths and `hash_ids`: one id per block of its prompt (512
tokens in Mooncake's, 16 in Bailian's), an id standing for its block and everything
before it, so two requests whose first k ids agree share their first k blocks. No text.
Bailian's lines also name their conversation turn (`chat_id`, `parent_chat_id`: -1 on a
first turn).

The trace becomes prompts of token ids, replayed by clients.bench.memory.sessions'
replay (the same policy, the same figures and definitions), every trace block scaled to
`block` tokens so that a run fits a small machine. A scaled token carries the KV bytes of
the trace tokens it stands for, so a prompt's bytes keep their published-depth size
(equivalently: the budget scaled down with the tokens, checkpoints kept whole). The
policy's thresholds in tokens (the guard's 16, a divergence's 256) are not scaled.

From ids to tokens:
- the system blocks: the leading ids held by at least a tenth of the requests (the
  system prompt conversations start with); they are the prompt's anchor;
- a request's parent: Bailian's `parent_chat_id`; without it, the latest earlier request
  all of whose whole blocks, more than the system blocks, the request holds. A request
  joins its parent's session; one with no parent starts a session;
- a block's tokens are fixed where its id first appears. Where a request's new blocks
  follow its parent's whole blocks, they begin with the parent's last, partial block and
  the parent's reply, as a chat's next turn does: the turn shares its parent's prompt and
  reply token for token, as far as its length reaches. The rest is one token per (block
  id, offset) by a fixed integer hash, a reply's one per (request, offset);
- the oracle: the longest prefix the prompt shares with an earlier prompt or reply,
  compared with the latest 16 requests holding its deepest known block, and its parent.

Without a trace at hand, `generate_trace` writes traffic in Mooncake's format with the
statistics of its conversation workload (clients.bench.memory.trace_traffic).
"""

from __future__ import annotations

import functools
import json
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

VOCAB = 150_000
SYSTEM_SHARE = 0.1  # an id held by this share of the requests leads a system prompt
HOLDERS = 16  # earlier requests per block the oracle compares with
TRACE_BLOCKS = {"mooncake": 512, "bailian": 16}


@dataclass(frozen=True)
class TraceRequest:
    """One line of a hash-ID trace."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    chat_id: int | None = None
    parent_chat_id: int | None = None  # None: a first turn, or a trace that names none


def read_trace(lines) -> list[TraceRequest]:
    """The requests of a trace's JSON lines (Mooncake's or Bailian's), by arrival."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            parent = row.get("parent_chat_id")
            req = TraceRequest(
                float(row["timestamp"]),
                int(row["input_length"]),
                int(row["output_length"]),
                tuple(int(h) for h in row["hash_ids"]),
                row.get("chat_id"),
                None if parent is None or parent == -1 else parent,
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"trace line {n} is not a hash-ID request ({e!r}): {line[:80]!r}")
        if not req.hash_ids or req.input_length < 1:
            raise ValueError(
                f"trace line {n}: input_length {req.input_length} over {len(req.hash_ids)} hash ids"
            )
        out.append(req)
    return sorted(out, key=lambda r: r.timestamp)


def read_trace_file(path) -> list[TraceRequest]:
    with open(path) as f:
        return read_trace(f)


def _fresh(key: int, start: int, stop: int) -> np.ndarray:
    """Tokens start..stop of `key`'s stream: splitmix64 of (key, offset), fixed forever."""
    x = (np.uint64(key) << np.uint64(24)) + np.arange(start, stop, dtype=np.uint64)
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(VOCAB) + np.uint64(16)).astype(np.int32)


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if len(diff) else n


@dataclass(frozen=True)
class TraceTurn:
    """A trace request as prompt tokens: what `trace_turns` derives from its ids."""

    prompt: np.ndarray
    reply: np.ndarray
    session: int
    parent: int | None  # index of its parent request
    anchor: int  # the system blocks' tokens
    starts: tuple[int, ...]  # where its turns start (the first after the anchor)
    roles: tuple[str, ...]
    oracle: int


def trace_turns(requests: list[TraceRequest], trace_block: int, block: int) -> list[TraceTurn]:
    """Each request's prompt, reply, session and oracle, `block` tokens a trace block."""
    if not 1 <= block <= trace_block:
        raise ValueError(f"block {block} must be within [1, the trace's {trace_block}]")
    ratio = trace_block / block
    held = Counter(h for r in requests for h in set(r.hash_ids))
    system = {h for h, c in held.items() if c >= SYSTEM_SHARE * len(requests)}
    table: dict[int, np.ndarray] = {}  # block id -> its tokens where it first appeared
    ends: dict[int, int] = {}  # id of a request's last whole block -> the latest such request
    holders: dict[int, deque] = {}
    chats: dict = {}
    out: list[TraceTurn] = []
    for i, r in enumerate(requests):
        n = len(r.hash_ids)
        tail = min(max(r.input_length - trace_block * (n - 1), 1), trace_block)
        length = (n - 1) * block + min(max(round(tail / ratio), 1), block)
        whole = _whole(r, trace_block)
        lead = 0
        while lead < n and r.hash_ids[lead] in system:
            lead += 1
        known = 0
        while known < n and r.hash_ids[known] in table:
            known += 1
        # 1) The parent: named by the trace, else the deepest earlier whole-block prefix.
        parent = chats.get(r.parent_chat_id) if r.parent_chat_id is not None else None
        if r.parent_chat_id is None:
            for k in range(known, lead, -1):
                if r.hash_ids[k - 1] in ends:
                    parent = ends[r.hash_ids[k - 1]]
                    break
        # 2) Where its new blocks start right after the parent's whole blocks, they carry
        # the parent's partial block and reply.
        carry = None
        if parent is not None:
            p, pw = out[parent], _whole(requests[parent], trace_block)
            if known == pw and r.hash_ids[:pw] == requests[parent].hash_ids[:pw]:
                carry = np.concatenate([p.prompt, p.reply])
        # 3) The tokens, block by block.
        prompt = np.empty(length, np.int32)
        for k, h in enumerate(r.hash_ids):
            a, b = k * block, min((k + 1) * block, length)
            if h in table and len(table[h]) >= b - a:
                prompt[a:b] = table[h][: b - a]
                continue
            if h in table:  # a partial block seen before, now longer: extend it
                m = len(table[h])
                prompt[a : a + m] = table[h]
                prompt[a + m : b] = _fresh(2 * h, m, b - a)
            else:
                prompt[a:b] = _fresh(2 * h, 0, b - a)
                if carry is not None and a < len(carry):
                    c = min(b, len(carry))
                    prompt[a:c] = carry[a:c]
            table[h] = prompt[a:b].copy()
        reply = _fresh(2 * i + 1, 0, max(1, round(r.output_length / ratio)))
        # 4) The oracle, against the latest holders of its deepest known block.
        oracle = 0
        if known:
            cands = set(holders.get(r.hash_ids[known - 1], ()))
            cands |= {parent} if parent is not None else set()
            oracle = max(
                (_lcp(prompt, np.concatenate([out[c].prompt, out[c].reply])) for c in cands),
                default=0,
            )
        anchor = min(lead * block, length)
        starts, roles = _layout(out[parent] if parent is not None else None, carry, anchor)
        keep = [s < length for s in starts]
        out.append(
            TraceTurn(
                prompt,
                reply,
                out[parent].session if parent is not None else i,
                parent,
                anchor,
                tuple(s for s, k in zip(starts, keep) if k),
                tuple(x for x, k in zip(roles, keep) if k),
                oracle,
            )
        )
        for h in r.hash_ids:
            holders.setdefault(h, deque(maxlen=HOLDERS)).append(i)
        if whole > lead:
            ends[r.hash_ids[whole - 1]] = i
        if r.chat_id is not None:
            chats[r.chat_id] = i
    return out


def _whole(r: TraceRequest, trace_block: int) -> int:
    return len(r.hash_ids) - (r.input_length < trace_block * len(r.hash_ids))


def _layout(parent: TraceTurn | None, carry, anchor: int):
    """Where the turns start: the parent's, then its reply and the new user turn."""
    if parent is None:
        return (anchor,), ("user",)
    if carry is None:
        return parent.starts, parent.roles
    ends = (len(parent.prompt), len(carry))
    return parent.starts + ends, parent.roles + ("assistant", "user")


@functools.lru_cache(maxsize=4)
def _trace_steps(lines: tuple | None, trace_block: int, block: int, every: int):
    """The trace's requests, their turns and the replay's steps: the same for every shape
    and variant of a run, so derived once (`lines` None: `generate_trace`'s)."""
    from clients.bench.memory.sessions import Turn
    from clients.bench.memory.trace_traffic import generate_trace
    from engine.cache.messages import PromptLayout

    requests = read_trace(generate_trace() if lines is None else lines)
    turns = trace_turns(requests, trace_block, block)
    if every > 1:  # a session's requests are kept or dropped together, then re-derived
        requests = [r for r, t in zip(requests, turns) if t.session % every == 0]
        turns = trace_turns(requests, trace_block, block)
    steps = [
        [
            Turn(
                f"t{i}",
                f"s{t.session}",
                "",
                t.prompt,
                t.anchor,
                PromptLayout(t.starts, roles=t.roles),
                t.reply,
                t.oracle,
            )
        ]
        for i, t in enumerate(turns)
    ]
    return requests, turns, steps


def trace_sessions(
    cache_config,
    kv_bytes_per_token: int,
    variants: dict,
    budget: int,
    lines=None,
    trace_block: int = TRACE_BLOCKS["mooncake"],
    block: int = 64,
    every: int = 1,
) -> dict:
    """name -> the trace's replay at `budget` bytes, for each of `variants` (name ->
    (one checkpoint's bytes, whether shared prefix rows are stored once)); `lines`: the
    trace's JSON lines (None: `generate_trace`'s); `every`: one session in this many
    kept (a machine serving fewer users than the trace's)."""
    import dataclasses

    from clients.bench.memory.sessions import replay_turns

    generated = lines is None
    requests, turns, steps = _trace_steps(
        None if generated else tuple(lines), trace_block, block, every
    )
    sessions = Counter(t.session for t in turns)
    returning = sum(1 for n in sessions.values() if n > 1)
    config = dataclasses.replace(
        cache_config, ram_budget=budget, anchor_max_bytes=budget, mode="lineage"
    )
    # A scaled token stands for trace_block / block tokens of the trace: their KV bytes.
    kv = round(kv_bytes_per_token * trace_block / block)
    out = {
        "budget_bytes": budget,
        "trace": {
            "source": "generated (Mooncake conversation statistics)" if generated else "file",
            "requests": len(turns),
            "sessions": len(sessions),
            "returning_sessions": returning,
            "trace_block": trace_block,
            "block": block,
            "every": every,
            "mean_input_tokens": sum(r.input_length for r in requests) / len(requests),
            "oracle_share_of_prompts": sum(t.oracle for t in turns)
            / sum(len(t.prompt) for t in turns),
        },
    }
    for name, (nbytes, shared) in variants.items():
        figures = replay_turns(steps, config, kv, nbytes, shared)
        # Sessions of one request are warm by definition: say how many of the rest were.
        figures["warm_returning_sessions"] = returning - (len(sessions) - figures["warm_sessions"])
        out[name] = figures
    return out
