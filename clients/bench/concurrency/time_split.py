"""Where the time to first token went, from the engine's own prefill log.

The model loop's prefill log (engine.runtime.batching.prefill_log: per request,
queued before admission, admitted to its first chunk, its chunks' forwards, the
time between them; and the chunk cost fit) is split here by the request's kind
(cold: the `cold` namespace; warm: the rest), beside the client's TTFT of the
same kind. What the client saw and the engine did not (the front end, gRPC and
Ray hops, the first decode step) is the client's TTFT less the engine's part.
It knows dicts and Sent records; nothing of engines.
"""

from __future__ import annotations

from clients.bench.figures import markdown_table, percentile

PARTS = ("queued_ms", "first_chunk_wait_ms", "in_chunks_ms", "between_chunks_ms")
# The time between a request's chunks, split: other requests' chunks, and the loop's own time
# (landing a chunk, the decode step it waits for, scheduling); not parts of the sum.
BETWEEN = ("others_chunks_ms", "loop_between_ms")


def time_split(log: dict, sent: list) -> dict:
    """Per kind: the parts' p50 and p90, their shares of the engine's time to the prompt end,
    the chunks per request, and the client's TTFT beside them; the chunk fit."""
    out: dict = {"fit": log.get("fit", {}), "chunks": log.get("chunks", 0)}
    out["fit_by_eval"] = log.get("fit_by_eval", {})
    for kind in ("cold", "warm"):
        rows = [
            r for r in log.get("requests", ()) if (r["namespace"] == "cold") == (kind == "cold")
        ]
        if not rows:
            continue
        engine = [sum(r[p] for p in PARTS) for r in rows]
        total = sum(engine) or 1.0
        client = [s.ttft_ms for s in sent if s.kind == kind]
        figures = {"requests": len(rows)}
        for p in PARTS:
            values = [r[p] for r in rows]
            figures[p] = {
                "p50": percentile(values, 50),
                "p90": percentile(values, 90),
                "share": sum(values) / total,
            }
        for p in BETWEEN:
            values = [_between(r, p) for r in rows]
            figures[p] = {
                "p50": percentile(values, 50),
                "p90": percentile(values, 90),
                "share": sum(values) / total,
            }
        figures["chunks_per_request_p50"] = percentile([r["chunks"] for r in rows], 50)
        figures["chunks_per_request_max"] = max(r["chunks"] for r in rows)
        figures["engine_ms_p50"] = percentile(engine, 50)
        figures["client_ttft_ms_p50"] = percentile(client, 50)
        figures["outside_ms_p50"] = percentile(client, 50) - percentile(engine, 50)
        out[kind] = figures
    fit = out["fit"]
    if fit.get("fixed_ms") is not None:
        fit["fixed_share"] = fit["fixed_ms"] * fit["chunks"] / (fit["total_ms"] or 1.0)
    return out


def _between(row: dict, part: str) -> float:
    """`part` of BETWEEN of a request's row (a log from before the split: all the loop's)."""
    others = row.get("others_chunks_ms", 0.0)
    return others if part == "others_chunks_ms" else row["between_chunks_ms"] - others


def _kind(row: dict) -> str:
    return "cold" if row["namespace"] == "cold" else "warm"


def split_lines(splits: dict) -> list[str]:
    """Per run and kind: the parts p50 / p90 (share), chunks; the chunk fit."""
    header = ("run", "kind", "n", *(p[:-3] + " p50/p90 ms (share)" for p in PARTS))
    header += ("between: others' chunks / the loop p50 (share)",)
    header += ("chunks p50 (max)", "engine p50", "client TTFT p50")
    rows = []
    for name, split in splits.items():
        for kind in ("cold", "warm"):
            f = split.get(kind)
            if not f:
                continue
            rows.append(
                [name, kind, str(f["requests"])]
                + [f"{f[p]['p50']:.0f}/{f[p]['p90']:.0f} ({f[p]['share']:.0%})" for p in PARTS]
                + [" / ".join(f"{f[p]['p50']:.0f} ({f[p]['share']:.0%})" for p in BETWEEN)]
                + [
                    f"{f['chunks_per_request_p50']:.0f} ({f['chunks_per_request_max']})",
                    f"{f['engine_ms_p50']:.0f}",
                    f"{f['client_ttft_ms_p50']:.0f}",
                ]
            )
    lines = ["", "where the time to the prompt end went (the engine's prefill log):"]
    lines += markdown_table(header, rows)
    fits = []
    for name, split in splits.items():
        fit = split["fit"]
        if fit.get("fixed_ms") is not None:
            fits.append(
                f"{name} {fit['chunks']} chunks, median {fit['median_tokens']} tokens "
                f"{fit['median_ms']:.0f} ms; fixed {fit['fixed_ms']:.1f} ms + "
                f"{fit['token_ms']:.3f} ms/token ({fit['fixed_share']:.0%} of chunk time fixed)"
            )
        for kind, part in split.get("fit_by_eval", {}).items():
            if part.get("fixed_ms") is not None:
                fits.append(
                    f"{name} {kind} {part['chunks']} chunks, median {part['median_tokens']} "
                    f"tokens; fixed {part['fixed_ms']:.1f} ms + {part['token_ms']:.3f} ms/token"
                )
    if fits:
        lines += ["", "chunk forward = fixed + per token (least squares): " + "; ".join(fits)]
    return lines
