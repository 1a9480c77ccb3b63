"""Where each prefill's time went, chunk by chunk: the chunk log of `--schedule srpt|fifo`.

The chunked batch generator tells it each chunk it ran (when it started, its
forward's seconds, its tokens, the sequences it prefilled, their context); it
keeps
- every sequence's track while it prefills: its first chunk's start, its
  chunks' count, tokens and forward seconds (`in_chunks_s`), the span from its
  first chunk's start to its last one's end, and the forward seconds of other
  sequences' chunks run while it prefilled (`others_s`: one chunk is in flight
  at a time, so the rest of the span went to the loop between chunks: landing
  a chunk, the decode step it waits for, the scheduling);
- the latest KEEP chunks, from which `fixed_cost` fits a chunk's forward time
  as a fixed cost plus a cost per token (least squares): over all, and apart
  for those evaluated whole and module by module.

The generator takes a sequence's track at its prompt end (`take`) and adds the
request's own clock (received, admitted: engine.runtime.output.Stamps) to make
the request's row (`request_row`). It knows perf_counter seconds, uids and
token counts; nothing of MLX, batches or requests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

KEEP = 4096  # chunks kept for the fit
ROWS = 4096  # requests' rows kept


@dataclass(frozen=True)
class ChunkRecord:
    start: float  # perf_counter s
    seconds: float  # its forward's wall time
    tokens: int  # prompt tokens of each sequence
    members: int  # sequences of the chunk
    context: int  # tokens in the cache before it (its first sequence's)
    by_module: bool = False  # evaluated module by module (another fixed cost)


@dataclass
class Track:
    """One sequence's prefill so far."""

    first_start: float
    last_end: float
    chunks: int = 0
    tokens: int = 0
    in_chunks_s: float = 0.0
    others_s: float = 0.0  # other sequences' chunks' forward seconds while it prefilled


class PrefillLog:
    """Chunks run and each prefilling sequence's track (module doc)."""

    def __init__(self):
        self.chunks: deque[ChunkRecord] = deque(maxlen=KEEP)
        self.tracks: dict[int, Track] = {}
        self.rows: deque[dict] = deque(maxlen=ROWS)

    def chunk(
        self, uids, start: float, seconds: float, tokens: int, context: int, by_module=False
    ) -> None:
        """A chunk ran: `tokens` prompt tokens of each of `uids` from `start`, `seconds` long
        (`by_module`: evaluated module by module)."""
        self.chunks.append(ChunkRecord(start, seconds, tokens, len(uids), context, by_module))
        for uid, track in self.tracks.items():
            if uid not in uids:
                track.others_s += seconds
        for uid in uids:
            track = self.tracks.get(uid)
            if track is None:
                track = self.tracks[uid] = Track(start, start)
            track.chunks += 1
            track.tokens += tokens
            track.in_chunks_s += seconds
            track.last_end = start + seconds

    def take(self, uid: int) -> Track | None:
        """`uid`'s track, forgotten here (its prompt ended, or it left)."""
        return self.tracks.pop(uid, None)

    def request_row(self, track: Track | None, received: float, admitted: float, **facts) -> None:
        """Keep a request's row: its clock (perf_counter s of its arrival at the model actor
        and of its admission into the batch) and its track; `facts` added as they are."""
        row = dict(facts, received=received, queued_ms=(admitted - received) * 1000)
        if track is None:  # nothing to prefill (a resend restored whole)
            row |= dict(chunks=0, chunk_tokens=0, first_chunk_wait_ms=0.0, in_chunks_ms=0.0)
            row |= dict(between_chunks_ms=0.0, others_chunks_ms=0.0, prefill_span_ms=0.0)
        else:
            span = track.last_end - track.first_start
            row |= dict(
                chunks=track.chunks,
                chunk_tokens=track.tokens,
                first_chunk_wait_ms=max(0.0, track.first_start - admitted) * 1000,
                in_chunks_ms=track.in_chunks_s * 1000,
                between_chunks_ms=max(0.0, span - track.in_chunks_s) * 1000,
                others_chunks_ms=min(track.others_s, max(0.0, span - track.in_chunks_s)) * 1000,
                prefill_span_ms=span * 1000,
            )
        self.rows.append(row)

    def report(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """The rows of requests received in [since, until], and the chunk fit of the chunks
        that started in it (all, and by how they were evaluated)."""
        rows = [r for r in self.rows if since <= r["received"] <= until]
        chunks = [c for c in self.chunks if since <= c.start <= until]
        by_eval = {
            "whole": fixed_cost([c for c in chunks if not c.by_module]),
            "module": fixed_cost([c for c in chunks if c.by_module]),
        }
        fit = fixed_cost(chunks)
        return {"requests": rows, "chunks": len(chunks), "fit": fit, "fit_by_eval": by_eval}


def fixed_cost(chunks) -> dict:
    """A chunk's forward ms as `fixed_ms + token_ms * tokens` (tokens of all its sequences),
    least squares over `chunks`; the chunks' median size and time."""
    points = [(c.tokens * c.members, c.seconds * 1000) for c in chunks]
    if len(points) < 2:
        return {"chunks": len(points)}
    n = len(points)
    mx_ = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx_) ** 2 for x, _ in points)
    slope = sum((x - mx_) * (y - my) for x, y in points) / sxx if sxx else 0.0
    sizes = sorted(x for x, _ in points)
    times = sorted(y for _, y in points)
    return {
        "chunks": n,
        "fixed_ms": my - slope * mx_,
        "token_ms": slope,
        "median_tokens": sizes[n // 2],
        "median_ms": times[n // 2],
        "total_ms": sum(times),
    }
