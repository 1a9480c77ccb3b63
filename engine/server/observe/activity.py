"""What the front end saw of recent requests, and the live figures built from it.

`Activity` keeps the latest finished requests (a bounded deque of
`RequestRecord`) and answers figures over a recent window: requests and
cached tokens by restore kind, and per replica its tokens per second and
median time to first token. `Inspection` is the frozen value the Inspect RPC
and `lineage top` show; `inspection(...)` assembles it from the cache
manager's CacheStats and anchors and each replica's GeneratorStats. No Ray, no
gRPC: the front end fetches, the servicer translates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Mapping

from engine.cache.messages import AnchorUse, CacheStats
from engine.runtime.events import Finished, Timing
from engine.runtime.tier.stats import GeneratorStats

WINDOW_S = 60.0  # "the last minute" of `lineage top`
KEEP = 512  # records kept


OTHER_NAMESPACES = "other"  # the tag of every tenant past the cap


class NamespaceTags:
    """A request's cache namespace as metrics, Inspect and `lineage top` show it.

    Only its root tenant shows (`acme` for `acme/dev`). `hash` (the default:
    namespaces can name tenants) gives 8 hex digits of an HMAC-SHA256 of it,
    keyed by a secret drawn when the server starts, so a dictionary of tenant
    names does not reverse it (the tags change with each start); `plain` the
    root as it is; `off` nothing. The empty namespace stays empty. At most
    `cap` roots get a tag of their own; later ones share OTHER_NAMESPACES, so
    the metrics' series stay few however many namespaces come.
    """

    def __init__(self, how: str = "hash", cap: int = 32, key: bytes | None = None):
        self.how, self.cap = how, cap
        self.key = os.urandom(16) if key is None else key
        self.tags: dict[str, str] = {}  # root -> tag, in the order roots came

    def tag(self, namespace: str) -> str:
        if self.how == "off" or not namespace:
            return ""
        root = namespace.split("/", 1)[0]
        tag = self.tags.get(root)
        if tag is None:
            if len(self.tags) >= self.cap:
                return OTHER_NAMESPACES
            tag = root if self.how == "plain" else self._hash(root)
            self.tags[root] = tag
        return tag

    def _hash(self, root: str) -> str:
        return hmac.new(self.key, root.encode(), hashlib.sha256).hexdigest()[:8]


@dataclass(frozen=True)
class RequestRecord:
    request_id: str
    replica: str
    namespace: str  # as NamespaceTags shows it
    finish_reason: str
    restore_kind: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timing: Timing
    finished_at: float  # unix seconds
    # Why it restored less than an earlier prompt offered ("": it did not); engine.cache.misses.
    miss_kind: str = ""
    miss_token: int = 0
    miss_message: int = 0

    @classmethod
    def of(cls, f: Finished, namespace: str, at: float, miss=None) -> "RequestRecord":
        return cls(
            f.request_id,
            f.replica,
            namespace,
            str(f.finish_reason),
            str(f.restore_kind),
            f.prompt_tokens,
            f.cached_tokens,
            f.completion_tokens,
            f.timing,
            at,
            str(miss.kind) if miss else "",
            miss.token if miss else 0,
            miss.message if miss else 0,
        )


@dataclass(frozen=True)
class KindFigures:
    kind: str  # restore kind
    requests: int
    cached_tokens: int
    prompt_tokens: int


@dataclass(frozen=True)
class ReplicaFigures:
    name: str
    queue_requests: int
    queue_prefill_tokens: int
    running: int
    tokens_per_s: float
    ttft_p50_ms: float
    ram_bytes: int
    mlx_active_bytes: int
    mlx_peak_bytes: int
    disk_written_bytes: int
    disk_read_bytes: int
    grammars_compiled: int = 0
    grammar_hits: int = 0
    grammars_held: int = 0
    disk_writes_lost: dict = dataclasses.field(default_factory=dict)  # by cause (LOST_CAUSES)
    disk_state: str = "off"  # writing | paused (the disk was full) | off (no disk tier)
    disk_paused_s: float = 0.0  # seconds left of the pause
    disk_files_written: int = 0


# A lost disk write's cause, by the disk writer's counter that counts it.
LOST_CAUSES = {
    "refused": "queue_full",
    "no_space": "disk_full",
    "failed": "failed",
    "skipped": "not_held",
}


def disk_figures(disk: dict | None) -> dict:
    """A replica's disk tier as ReplicaFigures shows it, from its DiskStore.stats()."""
    if not disk:
        return {}
    writer = disk.get("writer", {})
    paused = float(disk.get("paused_s", 0.0))
    return {
        "disk_writes_lost": {c: int(writer.get(k, 0)) for k, c in LOST_CAUSES.items()},
        "disk_state": "paused" if paused > 0 else "writing",
        "disk_paused_s": paused,
        "disk_files_written": int(writer.get("files", 0)),
    }


@dataclass(frozen=True)
class TierFigures:
    tier: str  # ram | anchors | disk
    nbytes: int
    budget: int


@dataclass(frozen=True)
class Inspection:
    cache: CacheStats
    replicas: tuple[ReplicaFigures, ...]
    tiers: tuple[TierFigures, ...]
    window_s: float
    window: tuple[KindFigures, ...]
    anchors: tuple[AnchorUse, ...]
    recent: tuple[RequestRecord, ...]  # newest first


class Activity:
    """The latest finished requests; figures over the last `window_s` seconds."""

    def __init__(self, keep: int = KEEP, window_s: float = WINDOW_S):
        self.records: deque[RequestRecord] = deque(maxlen=keep)
        # Each record's (cache namespace, session key), in step with `records`: the cache
        # page shows a tenant its own requests only (engine.server.observe.cache_view).
        self.owners: deque[tuple[str, str]] = deque(maxlen=keep)
        self.window_s = window_s

    def record(
        self,
        f: Finished,
        namespace: str,
        at: float | None = None,
        miss=None,
        owner: tuple[str, str] = ("", ""),
    ) -> RequestRecord:
        """Keep a finished request; `miss`: its plan's Miss, if any; `owner`: its
        (namespace, session key)."""
        r = RequestRecord.of(f, namespace, time.time() if at is None else at, miss)
        self.records.append(r)
        self.owners.append(owner)
        return r

    def latest(self, n: int) -> tuple[RequestRecord, ...]:
        return tuple(reversed(self.records))[:n]

    def _recent(self, now: float) -> list[RequestRecord]:
        return [r for r in self.records if now - r.finished_at <= self.window_s]

    def by_kind(self, now: float | None = None) -> tuple[KindFigures, ...]:
        """Requests, cached and prompt tokens by restore kind over the window."""
        sums: dict[str, list[int]] = {}
        for r in self._recent(time.time() if now is None else now):
            s = sums.setdefault(r.restore_kind, [0, 0, 0])
            s[0] += 1
            s[1] += r.cached_tokens
            s[2] += r.prompt_tokens
        return tuple(KindFigures(k, *v) for k, v in sorted(sums.items()))

    def rates(self, replica: str, now: float | None = None) -> tuple[float, float]:
        """(completion tokens per second, median TTFT ms) of `replica` over the window."""
        recent = [r for r in self._recent(time.time() if now is None else now)]
        mine = [r for r in recent if r.replica == replica]
        ttfts = [r.timing.ttft_ms for r in mine if r.completion_tokens]
        tokens = sum(r.completion_tokens for r in mine)
        return tokens / self.window_s, statistics.median(ttfts) if ttfts else 0.0


def replica_figures(name: str, t: GeneratorStats, activity: Activity) -> ReplicaFigures:
    """One replica's row: its GeneratorStats plus its rates from the front end's records."""
    tps, ttft = activity.rates(name)
    disk = t.disk or {}
    return ReplicaFigures(
        name=name,
        queue_requests=t.pending,
        queue_prefill_tokens=t.pending_prefill_tokens,
        running=t.active,
        tokens_per_s=tps,
        ttft_p50_ms=ttft,
        ram_bytes=t.ram_bytes,
        mlx_active_bytes=t.mlx_active_bytes,
        mlx_peak_bytes=t.mlx_peak_bytes,
        disk_written_bytes=int(disk.get("writer", {}).get("bytes", 0)),
        disk_read_bytes=int(disk.get("load_bytes", 0)),
        grammars_compiled=t.grammars_compiled,
        grammar_hits=t.grammar_hits,
        grammars_held=t.grammars_held,
        **disk_figures(t.disk),
    )


def inspection(
    cache: CacheStats,
    anchors: list[AnchorUse],
    replicas: Mapping[str, GeneratorStats],
    budgets: Mapping[str, int],
    activity: Activity,
    namespaces: NamespaceTags,
    recent: int = 20,
) -> Inspection:
    """The Inspect RPC's figures. `budgets`: tier name -> bytes (ram, anchors, disk)."""
    held = {"ram": cache.ram_bytes, "anchors": cache.anchor_bytes, "disk": cache.disk_bytes}
    return Inspection(
        cache=cache,
        replicas=tuple(replica_figures(n, t, activity) for n, t in sorted(replicas.items())),
        tiers=tuple(TierFigures(k, v, int(budgets.get(k, 0))) for k, v in held.items()),
        window_s=activity.window_s,
        window=activity.by_kind(),
        anchors=tuple(
            dataclasses.replace(a, namespace=namespaces.tag(a.namespace)) for a in anchors
        ),
        recent=activity.latest(recent),
    )
