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
the request's row (`request_row`), with a fixed set of facts (FACTS).

Chunks and rows are kept in `Ring`s (engine.runtime.batching.ring): their full size
is allocated at construction, so a long-lived loop's memory does not creep as they
fill. A row's strings (request id, namespace) are object fields holding the caller's
own strings: a fixed-width field would cut a long id or pay its width on every row.
Those strings are what still fills: about 580 KiB over the first ROWS rows (ids of
41 characters, a namespace each), flat after.

It knows perf_counter seconds, uids and token counts; nothing of MLX, batches or
requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.runtime.batching.ring import Ring

KEEP = 4096  # chunks kept for the fit
ROWS = 4096  # requests' rows kept

# One kept chunk: ChunkRecord's fields.
CHUNK = [
    ("start", "f8"),
    ("seconds", "f8"),
    ("tokens", "i8"),
    ("members", "i8"),
    ("context", "i8"),
    ("by_module", "?"),
]
# A request row's facts, in a row's key order, and how each is kept.
FACTS = {"request_id": "O", "namespace": "O", "prompt_tokens": "i8", "restored": "i8"}
# A row's measured keys, after the facts.
MEASURED = [
    ("received", "f8"),
    ("queued_ms", "f8"),
    ("chunks", "i8"),
    ("chunk_tokens", "i8"),
    ("first_chunk_wait_ms", "f8"),
    ("in_chunks_ms", "f8"),
    ("between_chunks_ms", "f8"),
    ("others_chunks_ms", "f8"),
    ("prefill_span_ms", "f8"),
]
# One kept row: which facts it was given (bit i: FACTS' i-th), the facts, the measures.
ROW = [("given", "u1"), *FACTS.items(), *MEASURED]


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
        self.chunks = Ring(CHUNK, KEEP)
        self.tracks: dict[int, Track] = {}
        self.rows = Ring(ROW, ROWS)

    def chunk(
        self, uids, start: float, seconds: float, tokens: int, context: int, by_module=False
    ) -> None:
        """A chunk ran: `tokens` prompt tokens of each of `uids` from `start`, `seconds` long
        (`by_module`: evaluated module by module)."""
        self.chunks.append((start, seconds, tokens, len(uids), context, by_module))
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
        and of its admission into the batch), its track, and `facts` as given (FACTS' keys
        only: an unknown one is a TypeError)."""
        unknown = facts.keys() - FACTS.keys()
        if unknown:
            raise TypeError(f"unknown request facts {sorted(unknown)}; known: {list(FACTS)}")
        given = sum(1 << i for i, key in enumerate(FACTS) if key in facts)
        kept = [facts.get(key, None if kind == "O" else 0) for key, kind in FACTS.items()]
        queued_ms = (admitted - received) * 1000
        if track is None:  # nothing to prefill (a resend restored whole)
            measured = (0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
        else:
            span = track.last_end - track.first_start
            measured = (
                track.chunks,
                track.tokens,
                max(0.0, track.first_start - admitted) * 1000,
                track.in_chunks_s * 1000,
                max(0.0, span - track.in_chunks_s) * 1000,
                min(track.others_s, max(0.0, span - track.in_chunks_s)) * 1000,
                span * 1000,
            )
        self.rows.append((given, *kept, received, queued_ms, *measured))

    def chunks_in(self, since: float = 0.0, until: float = float("inf")) -> list[ChunkRecord]:
        """The kept chunks that started in [since, until], oldest first."""
        kept = self.chunks.ordered()
        start = kept["start"]
        return [ChunkRecord(*c) for c in kept[(since <= start) & (start <= until)].tolist()]

    def requests_in(self, since: float = 0.0, until: float = float("inf")) -> list[dict]:
        """The kept rows of requests received in [since, until], oldest first: each the
        facts it was given, then the measured keys (MEASURED)."""
        kept = self.rows.ordered()
        received = kept["received"]
        out = []
        for given, *values in kept[(since <= received) & (received <= until)].tolist():
            facts = zip(FACTS, values[: len(FACTS)])
            row = {key: v for i, (key, v) in enumerate(facts) if given >> i & 1}
            row.update(zip((key for key, _ in MEASURED), values[len(FACTS) :]))
            out.append(row)
        return out

    def report(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """The rows of requests received in [since, until], and the chunk fit of the chunks
        that started in it (all, and by how they were evaluated)."""
        rows = self.requests_in(since, until)
        chunks = self.chunks_in(since, until)
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
