"""`lineage bench agents --replicas N`: the same agent traffic on N replicas against one.

The agents benchmark (clients.bench.agents) runs `lineage` on one replica and
`lineage_xN` on N, each a fresh engine on the same seeded traffic. After the
N-replica run, while its engine still serves, this module reads what the
replicas did (requests routed to each, handovers and their bytes from
CacheStats, each handover's time from the receiving replica) and measures a
cold prefill of the same number of tokens as the longest entry handed over
(the first tokens of the longest prompt of the traffic, in a namespace of its
own, so nothing restores). `compare(report)` prints the side-by-side figures:
cached tokens (target: at least 0.97x one replica's), time to first token
p50/p90, throughput, handovers, and handover time against that cold prefill
(target: at most 0.1x).

Cheap to import: Ray is imported inside the functions.
"""

from __future__ import annotations

import re

from clients.bench.figures import median

NAME = re.compile(r"^(lineage|exact|off)_x(\d+)$")  # a policy on N replicas


def parse(name: str) -> tuple[str, int] | None:
    """('lineage', 2) for 'lineage_x2'; None for a plain policy name."""
    m = NAME.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def replica_figures(engine, client, observed: list, probes: int = 3) -> dict:
    """What the replicas of a running engine did, and the handover-vs-cold-prefill probe."""
    import ray

    stats = client.cache_stats()["replicas"]
    handovers = ray.get([m.handover_stats.remote() for m in engine.engine.replicas], timeout=120)
    records = [r for h in handovers for r in h.records]
    out = {
        "replicas": len(stats),
        "requests": [r["requests"] for r in stats],
        "restores": [r["restores"] for r in stats],
        "handovers": sum(r["handovers"] for r in stats),
        "handover_bytes": sum(r["handover_bytes"] for r in stats),
        "handovers_fetched": sum(h.fetched for h in handovers),
        "handovers_failed": sum(h.failed for h in handovers),
        "handover_ms_total": 1000 * sum(h.seconds for h in handovers),
    }
    if not records:
        return out
    tokens, nbytes, seconds = max(records)  # the longest entry handed over
    prompt = max((o.prompt for o in observed), key=len)
    length = min(tokens, len(prompt) - 1)
    cold = []
    for i in range(probes):
        result = client.generate(
            prompt_ids=[int(t) for t in prompt[: length + 1]],
            max_tokens=1,
            namespace=f"handover-probe-{i}",
        )
        assert result.restore.kind == "none", "the probe must prefill cold"
        cold.append(result.timing.prefill_ms)
    same = [s for t, _, s in records if t == tokens]
    out.update(
        probe_tokens=tokens,
        probe_bytes=nbytes,
        handover_ms=1000 * median(same),
        cold_prefill_ms=median(cold),
    )
    out["handover_vs_cold"] = out["handover_ms"] / out["cold_prefill_ms"]
    return out


def compare(report: dict) -> str:
    """One replica against N on the same traffic, from the agents report; '' when not run."""
    policies = report["policies"]
    lines = []
    for name, p in policies.items():
        parsed = parse(name)
        one = policies.get(parsed[0]) if parsed else None
        if one is None or "replicas" not in p:
            continue
        r = p["replicas"]
        ratio = p["cached_tokens"] / one["cached_tokens"] if one["cached_tokens"] else 1.0
        lines += [
            f"{parsed[0]} on {parsed[1]} replicas against 1, same traffic:",
            f"  cached tokens      {p['cached_tokens']} vs {one['cached_tokens']} "
            f"({ratio:.3f}x; target >= 0.97x)",
            f"  ttft p50 / p90 ms  {p['ttft_ms_p50']:.1f} / {p['ttft_ms_p90']:.1f} vs "
            f"{one['ttft_ms_p50']:.1f} / {one['ttft_ms_p90']:.1f}",
            f"  throughput tok/s   {p['tokens_per_s']:.0f} vs {one['tokens_per_s']:.0f} "
            f"(prompt + completion tokens over the wall time)",
            f"  requests/replica   {r['requests']}",
            f"  handovers          {r['handovers']} ({r['handover_bytes'] / 1e6:.1f} MB; "
            f"{r['handovers_fetched']} fetched, {r['handovers_failed']} failed)",
        ]
        if "handover_vs_cold" in r:
            lines.append(
                f"  handover vs cold   {r['handover_ms']:.1f} ms to hand over "
                f"{r['probe_tokens']} tokens ({r['probe_bytes'] / 1e6:.1f} MB) vs "
                f"{r['cold_prefill_ms']:.1f} ms to prefill them cold "
                f"({r['handover_vs_cold']:.3f}x; target <= 0.1x)"
            )
    return "\n".join(lines)
