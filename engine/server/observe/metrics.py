"""Prometheus metrics through ray.util.metrics, recorded in the front-end process.

Ray exports them from every node's metrics agent (`lineage serve --metrics-port
P`: http://127.0.0.1:P/metrics; without it a Ray the serve starts collects no
metrics and these calls record nothing, silently) and its dashboard shows them; each name starts
`lineage_` (Ray prefixes `ray_`). Every metric is tagged `engine` (the Ray
namespace its actors are named in), `model`, `replica` and `namespace`;
cache-wide figures carry an empty replica and namespace, and the namespace is
its root tenant's salted short hash unless the operator opts in, one of at
most `--metrics-namespaces` tags (engine.server.observe.activity.NamespaceTags), so
the series stay few.

Three sources: `request(...)` at each request's end (the Finished event: counts,
tokens, timings), and `sample(inspection)` about once a second from the cache
manager's CacheStats and each replica's GeneratorStats, whose cumulative counters
are turned into counter increments (so the metrics equal CacheStats), and
`analysis(failures)` with it, the prompt builder's count of its own renders and
grammars that failed on the model's template (engine.server.prompts.renders). The
cache policy stays free of Ray: nothing here reaches into engine/cache but its
messages.
"""

from __future__ import annotations

from typing import Mapping

from ray.util.metrics import Counter, Gauge, Histogram

from engine.cache.kinds import RestoreKind
from engine.runtime.events import Finished
from engine.server.observe.activity import Inspection

TAGS = ("engine", "model", "replica", "namespace")
MS = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000]
TOKENS = [16, 64, 256, 1024, 4096, 16384, 65536, 262144]
TPS = [1, 5, 10, 20, 40, 80, 160, 320, 640]


class EngineMetrics:
    """The engine's metrics; one per front end."""

    def __init__(self, engine: str, model: str, memory=None):
        """`memory`: the MemoryShares the actors were given (its parts become a gauge)."""
        self.engine = engine
        self.model = model
        self.memory = memory
        self._seen: dict[tuple, float] = {}  # cumulative values already counted

        def counter(name: str, text: str, *keys: str) -> Counter:
            return Counter(name, text, tag_keys=TAGS + keys)

        def gauge(name: str, text: str, *keys: str) -> Gauge:
            return Gauge(name, text, tag_keys=TAGS + keys)

        def histogram(name: str, text: str, bounds: list) -> Histogram:
            return Histogram(name, text, boundaries=bounds, tag_keys=TAGS)

        self.requests = counter("lineage_requests_total", "requests by finish reason", "reason")
        self.tokens = counter("lineage_tokens_total", "prompt, cached, completion tokens", "kind")
        self.restores = counter("lineage_restores_total", "planned restores by kind", "kind")
        self.captures = counter("lineage_captures_total", "planned captures by kind", "kind")
        self.evictions = counter("lineage_evictions_total", "evicted entries by tier", "tier")
        self.disk_bytes = counter("lineage_disk_bytes_total", "disk tier bytes", "direction")
        self.disk_writes_lost = counter(
            "lineage_disk_writes_lost_total",
            "file writes that never reached the disk, by cause "
            "(queue_full, disk_full, failed, not_held)",
            "cause",
        )
        self.restore_failures = counter(
            "lineage_restore_failures_total", "planned restores that prefilled cold"
        )
        self.flight_waits = counter(
            "lineage_flight_waits_total",
            "plans answered: wait for the request in flight that prefills this prompt's prefix",
        )
        self.errors = counter("lineage_errors_total", "failed calls by gRPC status", "code")
        self.analysis_failures = counter(
            "lineage_analysis_failures_total",
            "the engine's own template renders and grammars that failed (served without them)",
            "kind",
        )
        self.entries = gauge("lineage_entries", "conversation entries in RAM")
        self.anchors = gauge("lineage_anchors", "anchors in RAM")
        self.checkpoints = gauge("lineage_checkpoints", "checkpoints in RAM by kind", "kind")
        self.tier_bytes = gauge("lineage_tier_bytes", "bytes held per tier", "tier")
        self.tier_budget = gauge("lineage_tier_budget_bytes", "budget per tier", "tier")
        self.queue_requests = gauge("lineage_queue_requests", "requests waiting for admission")
        self.queue_tokens = gauge("lineage_queue_prefill_tokens", "their uncached prompt tokens")
        self.running = gauge("lineage_running_sequences", "sequences in the batch")
        self.disk_writing = gauge(
            "lineage_disk_writing", "1: the replica's disk tier writes; 0: paused (disk full)"
        )
        self.disk_file_bytes = gauge(
            "lineage_disk_file_bytes", "bytes of the files in the cache directory"
        )
        self.disk_free_bytes = gauge(
            "lineage_disk_free_bytes", "bytes free on the cache directory's filesystem"
        )
        self.mlx_active = gauge("lineage_mlx_active_bytes", "MLX memory allocated")
        self.mlx_peak = gauge("lineage_mlx_peak_bytes", "MLX memory at its peak")
        self.grammar_compiles = counter(
            "lineage_grammar_compiles_total", "grammars compiled (grammar cache misses)"
        )
        self.grammar_hits = counter(
            "lineage_grammar_hits_total", "constrained requests whose grammar was compiled"
        )
        self.grammars = gauge("lineage_grammars", "compiled grammars kept")
        self.shares = gauge("lineage_memory_plan_bytes", "the memory shares' parts", "part")
        self.ttft = histogram("lineage_ttft_ms", "time to first token (ms)", MS)
        self.queue_time = histogram("lineage_queue_ms", "queue time (ms)", MS)
        self.prefill = histogram("lineage_prefill_tokens", "prefilled tokens per request", TOKENS)
        self.decode = histogram("lineage_decode_tokens_per_second", "decode speed", TPS)
        self.commit = histogram("lineage_commit_ms", "commit time (ms)", MS)

    def _tags(self, replica: str = "", namespace: str = "", **more: str) -> dict:
        return {
            "engine": self.engine,
            "model": self.model,
            "replica": replica,
            "namespace": namespace,
            **more,
        }

    def request(self, f: Finished, namespace: str, captures, planned_length: int) -> None:
        """One finished request; `namespace` already tagged (NamespaceTags)."""
        tags = self._tags(f.replica, namespace)
        self.requests.inc(1, {**tags, "reason": str(f.finish_reason)})
        for kind, n in (
            ("prompt", f.prompt_tokens),
            ("cached", f.cached_tokens),
            ("completion", f.completion_tokens),
        ):
            if n > 0:
                self.tokens.inc(n, {**tags, "kind": kind})
        for c in captures:
            self.captures.inc(1, {**tags, "kind": str(c.kind)})
        if planned_length > 0 and f.restore_kind == RestoreKind.NONE:
            self.restore_failures.inc(1, tags)
        t = f.timing
        self.queue_time.observe(t.queue_ms, tags)
        self.prefill.observe(f.prompt_tokens - f.cached_tokens, tags)
        self.commit.observe(t.commit_ms, tags)
        if f.completion_tokens:
            self.ttft.observe(t.ttft_ms, tags)
        if t.decode_tps > 0:
            self.decode.observe(t.decode_tps, tags)

    def error(self, code: str) -> None:
        """A call that ended with gRPC status `code` (its name, e.g. INVALID_ARGUMENT)."""
        self.errors.inc(1, self._tags(code=code))

    def analysis(self, failures: Mapping[str, int]) -> None:
        """The prompt builder's cumulative analysis failures by kind (layout, anchor, probe,
        grammar: engine.server.prompts.renders)."""
        tags = self._tags()
        for kind, n in failures.items():
            self._count(self.analysis_failures, n, {**tags, "kind": kind})

    def _count(self, counter: Counter, total: float, tags: dict) -> None:
        """Advance `counter` to the cumulative `total` (a restarted source starts over)."""
        key = (id(counter), tuple(sorted(tags.items())))
        seen = self._seen.get(key, 0)
        step = total - seen if total >= seen else total
        self._seen[key] = total
        if step > 0:
            counter.inc(step, tags)

    def sample(self, s: Inspection) -> None:
        """Gauges and cumulative counters from one Inspection."""
        cache, tags = s.cache, self._tags()
        for kind, n in cache.hits.items():
            self._count(self.restores, n, {**tags, "kind": kind})
        self._count(self.evictions, cache.evictions, {**tags, "tier": "ram"})
        self._count(self.evictions, cache.disk_evictions, {**tags, "tier": "disk"})
        self._count(self.flight_waits, cache.flight_waits, tags)
        self.entries.set(cache.entries, tags)
        self.anchors.set(cache.anchors, tags)
        for kind, n in cache.checkpoints.items():
            self.checkpoints.set(n, {**tags, "kind": kind})
        for t in s.tiers:
            self.tier_bytes.set(t.nbytes, {**tags, "tier": t.tier})
            self.tier_budget.set(t.budget, {**tags, "tier": t.tier})
        if any(t.tier == "disk" and t.budget for t in s.tiers):
            self.disk_file_bytes.set(cache.disk_file_bytes, tags)
            self.disk_free_bytes.set(cache.disk_free_bytes, tags)
        for r in s.replicas:
            rt = self._tags(r.name)
            self.queue_requests.set(r.queue_requests, rt)
            self.queue_tokens.set(r.queue_prefill_tokens, rt)
            self.running.set(r.running, rt)
            self.mlx_active.set(r.mlx_active_bytes, rt)
            self.mlx_peak.set(r.mlx_peak_bytes, rt)
            self._count(self.disk_bytes, r.disk_written_bytes, {**rt, "direction": "written"})
            self._count(self.disk_bytes, r.disk_read_bytes, {**rt, "direction": "read"})
            self._count(self.grammar_compiles, r.grammars_compiled, rt)
            self._count(self.grammar_hits, r.grammar_hits, rt)
            self.grammars.set(r.grammars_held, rt)
            for cause, n in r.disk_writes_lost.items():
                self._count(self.disk_writes_lost, n, {**rt, "cause": cause})
            if r.disk_state != "off":
                self.disk_writing.set(1 if r.disk_state == "writing" else 0, rt)
        if self.memory is not None:
            for part, n in share_parts(self.memory).items():
                self.shares.set(n, {**tags, "part": part})


def share_parts(m) -> dict[str, int]:
    """A MemoryShares' parts in bytes, every replica's together, and its limit."""
    k = m.replicas
    return {
        "limit": m.limit,
        "weights": m.weights * k,
        "draft": m.draft * k,
        "running_kv": m.running_kv,
        "ram_tier": m.ram_budget,
        "pool": m.pool_limit * k,
        "grammars": m.grammars * k,
    }
