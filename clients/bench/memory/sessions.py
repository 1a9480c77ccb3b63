"""Warm sessions per budget: agent traffic against the pure cache policy at a shape's bytes.

The agent traffic of `lineage bench agents` (sub-agents on one shared system prompt
and tools, growing conversations, edits, regenerations) is replayed through the
cache manager alone (engine.cache: the policy that decides what the RAM tier holds),
every commit carrying a shape's own byte figures: its KV bytes per token and one
checkpoint's bytes, exact (the baseline) or at the served precision. No model runs:
the policy decides by those bytes alone, which is what the figures exercise, and a
full-depth shape could not run here.

Text becomes token ids by a word-level hash (a stable id per word and per gap), so
what two prompts share is what their texts share. Reported per precision:
- `share_of_oracle`: the tokens restored over the tokens an unbounded cache (every
  earlier prompt and reply of the namespace kept) would have restored;
- `warm_sessions`: sessions every returning turn of which restored at least 90% of
  what the oracle would have (the session stayed warm throughout);
- `held_at_end`: sessions whose latest entry is still held when the traffic ends;
- `warm_turns`: requests that restored at least 90% of what the oracle would have.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import zlib

import numpy as np

WORDS = re.compile(r"\w+|[^\w\s]|\s+")
VOCAB = 150_000


@functools.lru_cache(maxsize=1 << 16)
def token_ids(text: str) -> tuple[int, ...]:
    """The ids of `text`, a word (or gap) at a time. Cached by text: every turn re-sends its
    conversation, so the same system prompt and messages come back hundreds of times."""
    return tuple(zlib.crc32(w.encode()) % VOCAB + 16 for w in WORDS.findall(text))


def render(messages: list[dict], tools: tuple) -> tuple[np.ndarray, int, tuple, tuple]:
    """(tokens, anchor length, message starts, roles): the system message and the tools
    first (the anchor), then each message behind a role marker."""
    system = token_ids(messages[0]["content"]) + token_ids(json.dumps(list(tools)))
    out, starts, roles = list(system), [], []
    for m in messages[1:]:
        starts.append(len(out))
        roles.append(m["role"])
        out.append(1 + ("system", "user", "assistant", "tool").index(m["role"]))
        out += token_ids(m.get("content") or "")
        if m.get("tool_calls"):
            out += token_ids(json.dumps(m["tool_calls"]))
    return np.asarray(out, np.int32), len(system), tuple(starts), tuple(roles)


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if len(diff) else n


@dataclasses.dataclass(frozen=True)
class Turn:
    """One request of a replay, as the cache sees it, and the reply it gets (empty when
    its stream was dropped). `oracle`: the longest prefix an earlier prompt or reply of
    its namespace shares, where its traffic knows it; None: the replay compares them."""

    rid: str
    session: str
    namespace: str
    prompt: np.ndarray
    anchor: int
    layout: object  # engine.cache.messages.PromptLayout
    reply: np.ndarray
    oracle: int | None = None


def agent_turns(traffic):
    """The agent traffic's requests as Turns, step by step; each request's messages carry
    the replies of the requests before it (recorded once the caller took its turn)."""
    from clients.bench.agents.traffic import Sessions
    from engine.cache.messages import PromptLayout

    sessions = Sessions(traffic)
    for step in traffic.steps():
        for spec in step:
            messages = sessions.messages(spec)
            prompt, anchor, starts, roles = render(messages, traffic.tools)
            reply_text = f"reply {spec.rid} " + " ".join(["done"] * spec.max_tokens)
            completed = not spec.drop_after
            reply = np.asarray(token_ids(reply_text), np.int32) if completed else prompt[:0]
            layout = PromptLayout(starts, roles=roles)
            turn = Turn(f"r{spec.rid}", spec.session, spec.namespace, prompt, anchor, layout, reply)
            yield [turn]
            sessions.record(spec, messages, reply_text, completed)


def replay(
    traffic, cache_config, kv_bytes_per_token: int, state_bytes: int, shared_rows: bool = True
) -> dict:
    """The agent traffic through a CacheManager at these bytes; restored and oracle tokens."""
    turns = agent_turns(traffic)
    return replay_turns(turns, cache_config, kv_bytes_per_token, state_bytes, shared_rows)


def replay_turns(
    steps, cache_config, kv_bytes_per_token: int, state_bytes: int, shared_rows: bool = True
) -> dict:
    """Turns (lists of them, in order) through a CacheManager at these bytes; restored and
    oracle tokens, warm sessions.

    Each commit says where its entry reads its first rows from as the model actor
    would (engine.cache.shared_rows: the plan's offer or the anchor it stored, when
    still indexed); `shared_rows=False` stores every entry whole, as the engine did
    before it stored shared prefix rows once."""
    from engine.cache.kinds import CaptureKind
    from engine.cache.manager import CacheManager
    from engine.cache.messages import (
        AnchorCommit,
        CapturedPoint,
        Commit,
        PlanRequest,
    )
    from engine.cache.shared_rows import prefix_source

    manager = CacheManager(cache_config, fingerprint="memory", has_state_layers=True)
    seen: dict[str, list[np.ndarray]] = {}
    latest: dict[str, int] = {}
    cold: set[str] = set()  # sessions a returning turn of which found less than 90% warm
    restored = oracle = warm_turns = requests = 0
    for step in steps:
        for spec in step:
            prompt, anchor, layout, rid = spec.prompt, spec.anchor, spec.layout, spec.rid
            ns = spec.namespace
            best = spec.oracle
            if best is None:
                best = max((_lcp(prompt, s) for s in seen.get(ns, ())), default=0)
            best = min(best, len(prompt) - 1)
            requests += 1
            plan = manager.plan(PlanRequest(rid, prompt, anchor, ns, layout=layout))
            restored += plan.length
            oracle += best
            warm = plan.length >= 0.9 * best
            warm_turns += warm
            if spec.session in latest and not warm:
                cold.add(spec.session)
            reply = spec.reply
            stored_anchor = None
            for c in plan.captures:
                if c.kind == CaptureKind.ANCHOR and c.entry_id is not None:
                    manager.commit_anchor(
                        AnchorCommit(
                            rid, ns, c.entry_id, prompt[: c.length], kv_bytes_per_token, state_bytes
                        )
                    )
                    stored_anchor = (c.entry_id, c.length)
            prefix = None
            if shared_rows:  # the actor reads rows from an entry it holds (indexed here)
                prefix = prefix_source(plan.shares, stored_anchor, cache_config.shared_rows_min)
                if prefix is not None and manager.index.get(prefix[0]) is None:
                    prefix = None
            tokens = np.concatenate([prompt, reply]) if plan.store_reply else prompt
            points = tuple(
                CapturedPoint(c.length, c.kind, c.entry_id)
                for c in plan.captures
                if c.kind != CaptureKind.ANCHOR
            )
            manager.commit(
                Commit(
                    rid,
                    ns,
                    plan.new_entry_id,
                    tokens,
                    len(prompt),
                    plan.entry_id if plan.length else None,
                    plan.length,
                    points,
                    kv_bytes_per_token,
                    state_bytes,
                    prefix=prefix,
                )
            )
            latest[spec.session] = plan.new_entry_id
            if spec.oracle is None:
                seen.setdefault(ns, []).append(tokens)
    held = {e.id for e in manager.index.entries()}
    stats = manager.stats()
    return {
        "requests": requests,
        "sessions": len(latest),
        "warm_sessions": len(latest) - len(cold),
        "held_at_end": sum(1 for e in latest.values() if e in held),
        "warm_turns": warm_turns,
        "restored_tokens": restored,
        "oracle_tokens": oracle,
        "share_of_oracle": restored / oracle if oracle else 0.0,
        "ram_bytes": stats.ram_bytes,
        "evictions": stats.evictions,
    }


def warm_sessions(
    cache_config,
    kv_bytes_per_token: int,
    variants: dict,
    budget: int,
    agents: int = 12,
    scale: float = 2.0,
    seed: int = 0,
) -> dict:
    """name -> the replay at `budget` bytes, for each of `variants`: name -> (one
    checkpoint's bytes, whether shared prefix rows are stored once)."""
    from clients.bench.agents.traffic import build_traffic

    traffic = build_traffic(seed, scale, agents, message_edits=agents // 2)
    config = dataclasses.replace(
        cache_config, ram_budget=budget, anchor_max_bytes=budget, mode="lineage"
    )
    out = {"budget_bytes": budget, "traffic": traffic.summary()}
    turns = list(agent_turns(traffic))  # the traffic's requests, rendered once for every variant
    for name, (nbytes, shared) in variants.items():
        out[name] = replay_turns(turns, config, kv_bytes_per_token, nbytes, shared)
    return out
