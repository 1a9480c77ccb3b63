"""The lineage policy: one entry per conversation lineage plus checkpoints.

What it decides: where a prompt restores (the longest restore point in its
namespace), which capture points its prefill takes (anchor, guard,
divergence, points inside long messages and the system block), what a
commit stores (the new entry, its reply and captured checkpoints, anchors),
which older entry it absorbs, what thinning drops and
what the budgets evict; with a disk tier, which files to write (every entry it
indexes, when it is indexed; an entry whose file was evicted is spilled again
when it leaves RAM), which to delete (an absorbed source's, after its
successor's write; what the disk budget evicts), and when a restore point is
read from a file. What it does not know: tensors, file formats, replicas.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from engine.cache.anchor import anchor_victims, wants_anchor
from engine.cache.disk_index import DiskIndex, persist
from engine.cache.entry import Checkpoint, Entry
from engine.cache.index import Index, Lookup
from engine.cache.kinds import CaptureKind, CheckpointKind, Role
from engine.cache.message_points import (
    MESSAGE_SLICES,
    SYSTEM_SLICES,
    Span,
    message_points,
    spacing,
)
from engine.cache.messages import CapturePoint, Commit, RestorePlan
from engine.cache.orders import OrderBook
from engine.cache.ram_budget import ram_priority, victims
from engine.cache.thinning import thin
from engine.config import CacheConfig

MIN_CHECKPOINTS = 2  # what byte thinning leaves a lineage: its prompt end and its guard


def carry_over(source: Entry, restored: int) -> list[Checkpoint]:
    """The restore points of `source` that the entry absorbing it takes over.

    Its checkpoints at or before `restored`, its prompt end becoming a
    "final" turn boundary, and, when the absorbing prompt re-sent the whole
    reply (`restored` is the source's full length), its full-length state as
    a "final" point too. Everything beyond `restored` (later checkpoints, the
    reply tail the new prompt did not reuse) is dropped with the source.
    """
    out = [
        Checkpoint(n, CheckpointKind.FINAL if n == source.prompt_len else checkpoint.kind)
        for n, checkpoint in sorted(source.checkpoints.items())
        if n <= restored
    ]
    if restored == source.length:
        out.append(Checkpoint(source.length, CheckpointKind.FINAL))
    return out


class LineagePolicy:
    """Plans, commits and evictions of lineage mode over a shared Index."""

    def __init__(
        self,
        config: CacheConfig,
        index: Index,
        new_id: Callable[[], int],
        has_state_layers: bool,
        disk: DiskIndex | None = None,
    ) -> None:
        self.config = config
        self.index = index
        self._new_id = new_id
        self.has_state_layers = has_state_layers
        self.disk_index = disk
        # What one checkpoint costs in tokens of KV on the served model (its state bytes
        # over a token's KV bytes, from the commits): no point is placed to save a span
        # shorter than what its own bytes would hold of KV. 22 tokens on the embedded
        # model (the configured floors decide there), ~3,100 at Qwen3-Next-80B-A3B's.
        self.checkpoint_tokens = 0

    # -- plan ----------------------------------------------------------------

    def plan(
        self,
        request_id: str,
        namespace: str,
        prompt: np.ndarray,
        anchor_len: int,
        message_spans: tuple[Span, ...] = (),
        marks: tuple[int, ...] = (),
    ) -> RestorePlan:
        """The restore point and capture points for `prompt`; allocates the new entry's id first.

        `message_spans`: the prompt's messages after the (system + tools) block,
        as token spans (PromptLayout.spans), where long-message points go.
        `marks`: where the messages the client marked end (PromptLayout.marked).

        Changes no index: a restore point on the disk tier comes back with
        load_from_disk, and enters the RAM index only when the caller keeps
        that plan (`adopt`), so a plan replaced before then leaves nothing behind.
        """
        resent = self.index.prompt_end(namespace, prompt)
        if resent is not None:  # a verbatim resend: restored whole, nothing to prefill
            return RestorePlan(
                request_id,
                resent.id,
                len(prompt),
                resent.prompt_end_kind(),
                (),
                new_entry_id=self._new_id(),
                store_reply=True,
            )
        found, from_disk = self._restore(namespace, prompt[:-1])  # one uncached token
        restore = found.restore
        points: dict[int, str] = {}
        for length, kind in self._capture_points(
            namespace, prompt, anchor_len, message_spans, found, marks
        ):
            points.setdefault(length, kind)
        new_entry_id = self._new_id()
        captures = tuple(
            CapturePoint(n, kind, self._new_id() if kind == CaptureKind.ANCHOR else None)
            for n, kind in sorted(points.items())
        )
        return RestorePlan(
            request_id,
            restore.entry_id,
            restore.length,
            restore.kind,
            captures,
            new_entry_id=new_entry_id,
            store_reply=True,
            load_from_disk=from_disk,
        )

    def _restore(self, namespace: str, query: np.ndarray) -> tuple[Lookup, bool]:
        """The longest restore point in RAM, or on disk when a file offers a longer one.

        (lookup, whether it comes from a file). The disk index reads only files
        longer than RAM's best.
        """
        found = self.index.lookup(namespace, query, self.has_state_layers)
        if self.disk_index is None:
            return found, False
        held = _Held(self.index)
        on_disk = self.disk_index.lookup(
            namespace, query, self.has_state_layers, longer_than=found.restore.length, skip=held
        )
        sibling = max(found.sibling_lcp, on_disk.sibling_lcp)
        if on_disk.restore.entry_id is None:
            return Lookup(found.restore, sibling), False
        return Lookup(on_disk.restore, sibling), True

    def adopt(self, entry_id: int, held: Entry | None = None) -> None:
        """Index the disk tier's entry `entry_id` in RAM (a kept plan loads its file), or
        `held`, the RAM entry whose free was taken back (the actor still holds it, with
        what its file lacks: the prompt end's log-probabilities)."""
        if held is not None:
            self.index.add(held)
            return
        entry = self.disk_index.entry(entry_id)
        self.index.add(
            Entry(
                entry.id,
                entry.namespace,
                entry.role,
                entry.tokens,
                entry.prompt_len,
                entry.kv_bytes_per_token,
                entry.state_bytes,
                dict(entry.checkpoints),
            )
        )

    def _capture_points(
        self,
        namespace: str,
        prompt: np.ndarray,
        anchor_len: int,
        message_spans,
        found: Lookup,
        marks=(),
    ):
        """Yield (length, kind) candidates, all strictly between the restore length and len(prompt).

        The ends of the messages the client marked after the anchor (`marks`: it
        said it comes back there), then points inside the (system + tools) block
        and inside `message_spans` (engine.cache.message_points): at most
        `message_max` of the three, the marks' latest first, then the system
        block's, those thinning would keep.

        When two fall on one length the first yielded wins: the anchor entry
        also serves that length, and a divergence point also serves a resend
        there while it outlives a guard in thinning. On a model without state
        layers every length is restorable from the rows alone, so only the
        anchor (a pinned separate entry) is worth taking.
        """
        restored, size = found.restore.length, len(prompt)
        if wants_anchor(anchor_len, restored, size):
            if self.index.find_equal(namespace, Role.ANCHOR, prompt[:anchor_len]) is None:
                yield anchor_len, CaptureKind.ANCHOR
        if not self.has_state_layers:
            return
        cfg = self.config
        worth = self.checkpoint_tokens  # the shortest span a checkpoint's bytes pay for
        lo = max(restored, anchor_len)  # a mark inside the anchor is the anchor's
        marked = [n for n in marks if lo < n < size][-cfg.message_max :] if cfg.message_max else []
        most = cfg.message_max - len(marked)
        system_floor = max(cfg.system_interval, worth) if cfg.system_interval else 0
        block = [(0, anchor_len, spacing(anchor_len, system_floor, SYSTEM_SLICES))]
        system = message_points(block, most, restored, size)
        message_floor = max(cfg.message_interval, worth) if cfg.message_interval else 0
        spans = [
            (start, end, spacing(end - start, message_floor, MESSAGE_SLICES))
            for start, end in message_spans
        ]
        messages = message_points(spans, most - len(system), restored, size)
        yield from ((n, CaptureKind.MESSAGE) for n in marked)
        yield from ((n, CaptureKind.SYSTEM) for n in system)
        yield from ((n, CaptureKind.MESSAGE) for n in messages)
        gain = found.sibling_lcp - restored
        if gain > 0 and gain >= max(self.config.divergence_min_gain, worth):
            yield found.sibling_lcp, CaptureKind.DIVERGENCE
        guard = size - self.config.guard_offset
        if size - restored >= max(self.config.guard_min_suffix, worth) and restored < guard < size:
            yield guard, CaptureKind.GUARD

    # -- commit --------------------------------------------------------------

    def commit(self, c: Commit, tokens: np.ndarray, orders: OrderBook) -> None:
        """Store the request's entry and anchors, absorb its source, thin the new entry."""
        if c.kv_bytes_per_token > 0:
            self.checkpoint_tokens = c.state_bytes // c.kv_bytes_per_token
        for point in c.captures:
            if point.entry_id is not None:  # an anchor; a duplicate of a stored one is freed
                anchor = Entry.committed(
                    c, point.entry_id, Role.ANCHOR, tokens[: point.length].copy()
                )
                self.index.add_unique(anchor, orders)
        entry = Entry.committed(c, c.entry_id, Role.CONVERSATION, tokens)
        # A prefill cut short right at a capture point stores that state as the entry's own.
        own = [
            Checkpoint(p.length, p.kind)
            for p in c.captures
            if p.entry_id is None and p.length < len(tokens)
        ]
        if len(tokens) > c.prompt_len:
            own.append(Checkpoint(c.prompt_len, CheckpointKind.REPLY))
        source = self._absorbable(c)
        carried = carry_over(source, c.restored_length) if source else []
        mine = {p.length for p in own} | {entry.length}
        carried = [p for p in carried if p.length not in mine]  # a resend: its own state there
        live_guard = next((p.length for p in own if p.kind == CheckpointKind.GUARD), None)
        dropped = set(thin(own + carried, self._checkpoint_cap(entry), live_guard))
        for checkpoint in own:
            if checkpoint in dropped:
                orders.drop(entry.id, checkpoint.length)
                if checkpoint.length == entry.logits_at:  # dropped with its state
                    entry.logits_at = None
            else:
                entry.checkpoints[checkpoint.length] = checkpoint
        for checkpoint in carried:
            if checkpoint not in dropped:
                orders.move(source.id, checkpoint.length, entry.id)
                entry.checkpoints[checkpoint.length] = checkpoint
        if source is not None:
            # Its unmoved checkpoints and reply tail go with it; a request that
            # pins one still reads it (the free waits for the pin, and a move
            # copies the state, leaving the source whole until then).
            self.index.free(source.id, orders)
        self.index.add(entry)
        if c.prefix is not None and entry.prefix_id is None:  # its prefix entry is gone
            orders.rejoin(entry.id)
        for new in [self.index.get(p.entry_id) for p in c.captures] + [entry]:
            if new is not None:  # an anchor indexed now (not a duplicate), the new entry
                self._persist(new, orders)
        disk = self.disk_index
        if (
            source is not None
            and disk is not None
            and source.id in disk
            and orders.writes(entry.id)
        ):
            # The writer deletes the source's file once the new entry's is durable;
            # without that write (over the disk budget) the source's file stays.
            self.disk_index.supersede(entry.id, source.id)
            orders.supersede(entry.id, source.id)

    def _checkpoint_cap(self, entry: Entry) -> int:
        """The checkpoints a lineage keeps: `max_checkpoints`; where a checkpoint costs
        more KV than the span the placement floors were set for (`message_interval`: 22
        tokens against 256 on the embedded model, ~3,100 at Qwen3-Next-80B-A3B's
        shapes), no more than the KV of its own rows pays for in bytes (one checkpoint
        per `checkpoint_tokens` of them), and `MIN_CHECKPOINTS` at least."""
        cap = self.config.max_checkpoints
        if self.checkpoint_tokens <= max(self.config.message_interval, 1):
            return cap
        own = entry.length - entry.prefix_len
        return min(cap, max(MIN_CHECKPOINTS, own // self.checkpoint_tokens))

    def add_anchor(self, a, tokens: np.ndarray, orders: OrderBook) -> None:
        """Index an anchor captured mid-prefill (an AnchorCommit); a duplicate's id is freed."""
        entry = Entry(
            a.entry_id,
            a.namespace,
            "anchor",
            tokens,
            len(tokens),
            a.kv_bytes_per_token,
            a.state_bytes,
        )
        self.index.add_unique(entry, orders)
        if self.index.get(a.entry_id) is not None:
            self._persist(entry, orders)

    def add_prompt_end(self, p, tokens: np.ndarray) -> None:
        """Index a request's prompt end stored while it decodes (a PromptEndCommit): a
        conversation entry ending at the prompt, with its log-probabilities. No file: the
        request's commit supersedes it, or a waiter's absorbs it, before long."""
        entry = Entry(
            p.entry_id,
            p.namespace,
            Role.CONVERSATION,
            tokens,
            len(tokens),
            p.kv_bytes_per_token,
            p.state_bytes,
        )
        if p.logits_at == len(tokens):
            entry.logits_at, entry.logits_bytes = p.logits_at, p.logits_bytes
        self.index.add(entry)

    def _persist(self, entry: Entry, orders: OrderBook) -> None:
        persist(self.disk_index, entry, orders)

    def _absorbable(self, c: Commit) -> Entry | None:
        """The entry this request absorbs: a conversation source restored at or past its prompt end.

        Also when another in-flight request pins one of its restore points: a
        move copies the state (the model actor's tier shares the arrays), and
        the source's free waits for the pin.
        """
        source = self.index.get(c.restored_from)
        if (
            source is None
            or source.role != Role.CONVERSATION
            or c.restored_length < source.prompt_len
        ):
            return None
        return source

    # -- budgets -------------------------------------------------------------

    def evict(self, orders: OrderBook) -> list[Entry]:
        """Evict anchors beyond their caps, then what exceeds the RAM budget; return the victims.

        A victim without a file is spilled to disk (config spill_on_evict).
        """
        cfg = self.config
        anchors = self.index.entries(Role.ANCHOR)
        out = anchor_victims(anchors, cfg.anchor_max_entries, cfg.anchor_max_bytes)
        for entry in out:
            self.index.free(entry.id, orders)
        over: list[Entry] = []
        while True:  # a victim a request pins still holds RAM: the rest fits what it leaves
            room = max(0, cfg.ram_budget - self.index.deferred_bytes)
            # An entry others read their first rows from goes after them (its free
            # would only move those rows into theirs): each round frees leaves.
            entries = self.index.entries()
            total = sum(e.nbytes for e in entries)
            leaves = [e for e in entries if not self.index.has_dependents(e.id)]
            more = victims(
                sorted(leaves, key=ram_priority),
                max_bytes=room - (total - sum(e.nbytes for e in leaves)),
            )
            if not more:
                break
            for entry in more:
                self.index.free(entry.id, orders)
            over += more
        if cfg.spill_on_evict:
            for entry in out + over:
                self._persist(entry, orders)
        return out + over

    def check(self) -> None:
        """Assert lineage mode's invariants: checkpoint cap, anchor caps, unique anchors, budget."""
        cfg = self.config
        entries = self.index.entries()
        anchors = [e for e in entries if e.role == Role.ANCHOR]
        assert all(e.role in (Role.CONVERSATION, Role.ANCHOR) for e in entries)
        for entry in entries:
            assert len(entry.checkpoints) <= cfg.max_checkpoints, (entry.id, entry.checkpoints)
        assert len(anchors) <= cfg.anchor_max_entries
        assert sum(a.nbytes for a in anchors) <= cfg.anchor_max_bytes
        keys = {(a.namespace, a.tokens.tobytes()) for a in anchors}
        assert len(keys) == len(anchors), "two anchors hold the same tokens"
        assert sum(e.nbytes for e in entries) <= cfg.ram_budget
        if self.disk_index is not None:
            self.disk_index.check()
            for entry in entries:  # an entry in both tiers is the same entry
                on_disk = self.disk_index.entry(entry.id)
                if on_disk is not None:
                    assert np.array_equal(on_disk.tokens, entry.tokens), entry.id
                    assert on_disk.checkpoints == entry.checkpoints, entry.id


class _Held:
    """Ids the disk lookup leaves out: in the RAM index, or out of it with a free pending."""

    def __init__(self, index: Index) -> None:
        self.index = index

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self.index or entry_id in self.index.deferred
