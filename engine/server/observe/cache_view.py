"""What the cache page shows: the cache tree of a scope, its latest requests, the memory shares.

`cache_view(...)` joins the cache manager's tree (engine.cache.tree) with the
front end's latest requests (engine.server.observe.activity), each with its session
key, time to first token, cached share and the reason it missed in words
(`miss_words`), and, for the operator, the memory shares as parts of the limit.
A scope (a namespace) holds that namespace's entries and requests only; a
tenant's view is its own namespace's, without the memory shares, whose figures are
every tenant's together.
No Ray, no gRPC: the front end fetches, the servicer translates.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.cache.tree import CacheTree, visible
from engine.server.observe.activity import Activity

MAX_RECENT = 200

# The kinds of engine.cache.kinds.MissKind, in words.
_WHY = {
    "system": "the system prompt changed",
    "tools": "the tools changed",
    "history": "an earlier message was edited or dropped",
    "template": "the chat template rendered the same messages to other tokens",
    "evicted": "the cache it continues was evicted",
}


def miss_words(kind: str, token: int, message: int) -> str:
    """Why a request restored less than an earlier prompt offered, as a sentence ("": it
    did not): `system@812 m0` -> "the system prompt changed at token 812, in message 0"."""
    if not kind:
        return ""
    where = "before the first message" if message < 0 else f"in message {message}"
    return f"{_WHY.get(kind, kind)} at token {token}, {where}"


@dataclass(frozen=True)
class ViewRequest:
    request_id: str
    session: str
    namespace: str
    restore_kind: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_ms: float
    finished_at: float  # unix seconds
    miss: str  # miss_words


@dataclass(frozen=True)
class MemoryPart:
    name: str  # weights, running KV, RAM tier, ...
    nbytes: int  # planned (the bar's segment)
    used: int = -1  # held now, where known (-1: not measured)


@dataclass(frozen=True)
class DiskWriterView:
    replica: str
    state: str  # writing | paused (the disk was full) | off
    paused_s: float
    files_written: int
    writes_lost: dict  # by cause (engine.server.observe.activity.LOST_CAUSES)


@dataclass(frozen=True)
class DiskTierView:
    held_bytes: int = 0  # what the disk budget holds
    file_bytes: int = 0  # the files in the cache directory
    free_bytes: int = 0
    budget: int = 0
    writers: tuple[DiskWriterView, ...] = ()


@dataclass(frozen=True)
class CacheView:
    tree: CacheTree
    recent: tuple[ViewRequest, ...]  # newest first
    memory_limit: int = 0  # 0: no memory shares shown
    memory: tuple[MemoryPart, ...] = ()
    disk: DiskTierView = DiskTierView()  # the operator's view only


def disk_view(s) -> DiskTierView:
    """The disk tier of an Inspection (engine.server.observe.activity): budget, files, writers."""
    budget = next((t.budget for t in s.tiers if t.tier == "disk"), 0)
    writers = tuple(
        DiskWriterView(
            r.name, r.disk_state, r.disk_paused_s, r.disk_files_written, dict(r.disk_writes_lost)
        )
        for r in s.replicas
        if r.disk_state != "off"
    )
    c = s.cache
    return DiskTierView(c.disk_bytes, c.disk_file_bytes, c.disk_free_bytes, budget, writers)


def recent_requests(activity: Activity, scope: str | None, n: int) -> tuple[ViewRequest, ...]:
    """The latest `n` finished requests of `scope` (None: all), newest first."""
    out = []
    for r, (namespace, session) in zip(reversed(activity.records), reversed(activity.owners)):
        if len(out) >= n:
            break
        if not visible(namespace, scope):
            continue
        out.append(
            ViewRequest(
                r.request_id,
                session,
                namespace,
                r.restore_kind,
                r.prompt_tokens,
                r.cached_tokens,
                r.completion_tokens,
                r.timing.ttft_ms,
                r.finished_at,
                miss_words(r.miss_kind, r.miss_token, r.miss_message),
            )
        )
    return tuple(out)


def memory_parts(shares, tree: CacheTree) -> tuple[int, tuple[MemoryPart, ...]]:
    """(limit, parts) of a MemoryShares (engine.config.memory), the RAM tier's use from `tree`."""
    if shares is None:
        return 0, ()
    k = shares.replicas
    parts = (
        MemoryPart("weights", shares.weights * k),
        MemoryPart("draft model", shares.draft * k),
        MemoryPart("running KV", shares.running_kv),
        MemoryPart("RAM tier", shares.ram_budget, tree.ram_bytes),
        MemoryPart("MLX pool", shares.pool_limit * k),
        MemoryPart("grammars", shares.grammars * k),
    )
    return shares.limit, tuple(p for p in parts if p.nbytes > 0)


def cache_view(
    tree: CacheTree,
    activity: Activity,
    scope: str | None,
    recent: int,
    shares=None,
    disk: DiskTierView | None = None,
) -> CacheView:
    """The page's figures; `shares`: the MemoryShares, for the operator's view (None: a tenant's),
    its RAM tier held as the tree's (the scope's) bytes; `disk`: the disk tier, for the
    operator's view."""
    limit, parts = memory_parts(shares, tree)
    requests = recent_requests(activity, scope, min(recent, MAX_RECENT))
    return CacheView(tree, requests, limit, parts, disk or DiskTierView())
