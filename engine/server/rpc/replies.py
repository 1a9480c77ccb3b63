"""The domain's answers, written as proto: a Generate call's events, Inspect, CacheTree.

`coalesce` merges a step's consecutive token events of a branch into one chunk before
they go out; `to_event` writes one event, `to_inspect_reply` and `to_tree_reply` the
operator's views (the messages carry the dataclasses' field names); `model_name` is the
name a model is listed by (ModelInfo, the fleet's listing, the in-process bridge). It knows the
proto's reply messages and the domain's events and views; nothing of the servicer,
of who may see what, or of the figures' rounding (engine.server.observe.figures).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import PurePath

from engine.proto import engine_pb2
from engine.runtime.events import Finished, Progress, Tokens
from engine.server.observe.activity import Inspection, RequestRecord
from engine.server.observe.cache_view import CacheView


@functools.lru_cache(maxsize=64)
def model_name(path: str) -> str:
    """The name a model is listed by: its path's last part, never the server's layout.

    Kept per path: the in-process bridge asks it on every request (and the fleet's
    listing, per model), and a `PurePath` each time interned the path's parts anew
    once the previous call's had died (pathlib's parse), churning the interpreter's
    table of interned strings until it resized."""
    return PurePath(path).name


def to_event(event) -> engine_pb2.GenerateEvent:
    if isinstance(event, Progress):
        return engine_pb2.GenerateEvent(
            progress=engine_pb2.PrefillProgress(done=event.done, total=event.total)
        )
    if isinstance(event, Tokens):
        logprobs = [
            engine_pb2.TokenLogprobs(
                logprob=lp.logprob,
                top_ids=[i for i, _ in lp.top],
                top_logprobs=[v for _, v in lp.top],
                token=lp.token,
                top_tokens=lp.top_tokens,
            )
            for lp in event.logprobs
        ]
        chunk = engine_pb2.TokenChunk(
            ids=event.ids, text=event.text, logprobs=logprobs, index=event.index
        )
        return engine_pb2.GenerateEvent(chunk=chunk)
    assert isinstance(event, Finished), event
    return engine_pb2.GenerateEvent(
        final=engine_pb2.Final(
            finish_reason=event.finish_reason.value,
            request_id=event.request_id,
            usage=engine_pb2.Usage(
                prompt_tokens=event.prompt_tokens,
                cached_tokens=event.cached_tokens,
                completion_tokens=event.completion_tokens,
            ),
            restore=engine_pb2.Restore(kind=event.restore_kind.value, length=event.restore_length),
            timing=engine_pb2.Timing(**dataclasses.asdict(event.timing)),
            replica=event.replica,
            incomplete=event.incomplete,
            index=event.index,
            stop_sequence=event.stop_sequence,
        )
    )


def to_inspect_reply(i: Inspection) -> engine_pb2.InspectReply:
    """Inspection -> InspectReply: the messages carry the dataclasses' field names."""

    def record(r: RequestRecord) -> engine_pb2.RequestRecord:
        fields = dataclasses.asdict(r)
        fields["timing"] = engine_pb2.Timing(**fields["timing"])
        return engine_pb2.RequestRecord(**fields)

    return engine_pb2.InspectReply(
        cache=engine_pb2.CacheStatsReply(**dataclasses.asdict(i.cache)),
        replicas=[engine_pb2.ReplicaFigures(**dataclasses.asdict(r)) for r in i.replicas],
        tiers=[engine_pb2.TierFigures(**dataclasses.asdict(t)) for t in i.tiers],
        window_s=i.window_s,
        window=[engine_pb2.KindFigures(**dataclasses.asdict(k)) for k in i.window],
        anchors=[engine_pb2.AnchorFigures(**dataclasses.asdict(a)) for a in i.anchors],
        recent=[record(r) for r in i.recent],
    )


def to_tree_reply(v: CacheView) -> engine_pb2.CacheTreeReply:
    """CacheView -> CacheTreeReply: the messages carry the dataclasses' field names."""

    def entry(e) -> engine_pb2.TreeEntry:
        fields = dataclasses.asdict(e)
        fields["checkpoints"] = [engine_pb2.TreeCheckpoint(**c) for c in fields["checkpoints"]]
        return engine_pb2.TreeEntry(**fields)

    t = v.tree
    return engine_pb2.CacheTreeReply(
        mode=t.mode,
        entries=[entry(e) for e in t.entries],
        left_out=t.left_out,
        ram_bytes=t.ram_bytes,
        disk_bytes=t.disk_bytes,
        recent=[engine_pb2.ViewRequest(**dataclasses.asdict(r)) for r in v.recent],
        memory_limit=v.memory_limit,
        memory=[engine_pb2.MemoryPart(**dataclasses.asdict(p)) for p in v.memory],
        disk=engine_pb2.DiskTierView(
            held_bytes=v.disk.held_bytes,
            file_bytes=v.disk.file_bytes,
            free_bytes=v.disk.free_bytes,
            budget=v.disk.budget,
            writers=[engine_pb2.DiskWriterView(**dataclasses.asdict(w)) for w in v.disk.writers],
        ),
    )


def coalesce(batch: list) -> list:
    """Merge consecutive token events into one chunk; keep only the last progress."""
    out: list = []
    for e in batch:
        if isinstance(e, Tokens) and out and isinstance(out[-1], Tokens):
            last = out[-1]
            if last.index != e.index:  # another branch's
                out.append(e)
                continue
            out[-1] = dataclasses.replace(
                last,
                ids=last.ids + e.ids,
                text=last.text + e.text,
                logprobs=last.logprobs + e.logprobs,
            )
        elif isinstance(e, Progress) and out and isinstance(out[-1], Progress):
            out[-1] = e
        else:
            out.append(e)
    return out
