"""The cache as a tree, for people to look at: anchors, the conversations built on them, and
each one's checkpoints by kind, bytes and tier.

`cache_tree(...)` reads the RAM index, the disk index and the session keys and
answers plain frozen values (`CacheTree`): no arrays, nothing to act on. A
conversation's parent is the longest anchor of its namespace whose tokens are a
prefix of its own; those rows are counted once, on the anchor (`shared`), so a
hundred conversations on one system prompt do not show it a hundred times.
`SessionEntries` remembers, per (namespace, session key), the entry the
session's latest commit stored, while a tier holds that entry (a tree shows
no other): keys whose entry left both tiers go, so it is bounded by what the
tiers hold, not by the sessions ever seen (and by `max_keys` besides).

It decides nothing and changes nothing; plain Python and numpy, like the rest
of engine.cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.cache.entry import Entry
from engine.cache.kinds import Role

MAX_SESSIONS = 1 << 16  # session keys remembered, over every namespace
PRUNE_MIN = 256  # keys kept before the first sweep for entries no tier holds
MAX_ENTRIES = 5000  # entries one tree shows, most recently used first


@dataclass(frozen=True)
class TreeCheckpoint:
    """A restore point inside an entry: its length, why it exists, its state bytes."""

    length: int
    kind: str
    nbytes: int


@dataclass(frozen=True)
class TreeEntry:
    """One entry: what it holds, where, what it grew from and which sessions last wrote it."""

    entry_id: int
    namespace: str
    role: str  # anchor | conversation | snapshot
    length: int  # tokens
    prompt_len: int  # the prompt end; the rest is the reply
    nbytes: int  # RAM bytes (rows, state, checkpoints), or the file's on disk alone
    tier: str  # ram | disk | ram+disk
    parent: int  # the anchor it extends (0: none)
    shared: int  # tokens it shares with that anchor (their rows counted on the anchor)
    own_bytes: int  # nbytes less the shared rows
    checkpoints: tuple[TreeCheckpoint, ...]
    sessions: tuple[str, ...]  # session keys whose latest commit is this entry
    last_used: int  # the index's clock (larger: more recent)


@dataclass(frozen=True)
class CacheTree:
    mode: str
    entries: tuple[TreeEntry, ...]  # anchors first, then by last use, newest first
    left_out: int = 0  # entries past MAX_ENTRIES
    ram_bytes: int = 0  # of every entry in scope, those left out included
    disk_bytes: int = 0


class SessionEntries:
    """(namespace, session key) -> the entry its latest commit stored, least recent first."""

    def __init__(self, max_keys: int = MAX_SESSIONS, prune_min: int = PRUNE_MIN) -> None:
        self.max_keys = max_keys
        self.prune_min = prune_min
        self.entry_of: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._sweep_at = prune_min  # the next sweep, when the keys pass it

    def committed(
        self, namespace: str, session: str, entry_id: int, held: Callable[[int], bool] | None = None
    ) -> None:
        """The session's latest commit stored `entry_id`. `held(id)`: whether a tier holds an
        entry; past twice the keys the last sweep kept, the keys of entries none holds go
        (amortized: a sweep per as many commits as keys it kept)."""
        if not session:
            return
        key = (namespace, session)
        self.entry_of.pop(key, None)
        self.entry_of[key] = entry_id
        while len(self.entry_of) > self.max_keys:
            self.entry_of.popitem(last=False)
        if held is not None and len(self.entry_of) > self._sweep_at:
            for k in [k for k, e in self.entry_of.items() if not held(e)]:
                del self.entry_of[k]
            self._sweep_at = max(self.prune_min, 2 * len(self.entry_of))

    def by_entry(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for (_, session), entry_id in self.entry_of.items():
            out.setdefault(entry_id, []).append(session)
        return out


def visible(namespace: str, scope: str | None) -> bool:
    """Whether an entry of `namespace` shows in a tree of `scope` (None: every namespace;
    a tenant's scope holds its sub-namespaces, `acme/dev` in `acme`)."""
    if scope is None:
        return True
    return namespace == scope or (bool(scope) and namespace.startswith(scope + "/"))


def cache_tree(
    mode: str,
    ram: list[Entry],
    disk: list[Entry],
    sessions: SessionEntries,
    scope: str | None = None,
    limit: int = MAX_ENTRIES,
) -> CacheTree:
    """The tree of the entries in RAM and on disk of namespace `scope` (None: all)."""
    in_ram = {e.id: e for e in ram if visible(e.namespace, scope)}
    on_disk = {e.id: e for e in disk if visible(e.namespace, scope)}
    everything = {**on_disk, **in_ram}  # the RAM copy is the live one
    anchors = [e for e in everything.values() if e.role == Role.ANCHOR]
    keys = sessions.by_entry()
    order = sorted(
        everything.values(),
        key=lambda e: (e.role != Role.ANCHOR, -e.last_used if e.id in in_ram else 1, -e.id),
    )
    shown = order[:limit]
    out = []
    for e in shown:
        tier = "+".join(t for t, held in (("ram", in_ram), ("disk", on_disk)) if e.id in held)
        parent = _parent(e, anchors)
        shared = parent.length if parent is not None else 0
        nbytes = e.nbytes
        out.append(
            TreeEntry(
                entry_id=e.id,
                namespace=e.namespace,
                role=str(e.role),
                length=e.length,
                prompt_len=e.prompt_len,
                nbytes=nbytes,
                tier=tier,
                parent=parent.id if parent is not None else 0,
                shared=shared,
                own_bytes=max(0, nbytes - shared * e.kv_bytes_per_token),
                checkpoints=tuple(
                    TreeCheckpoint(n, str(c.kind), e.state_bytes)
                    for n, c in sorted(e.checkpoints.items())
                ),
                sessions=tuple(sorted(keys.get(e.id, ()))),
                last_used=e.last_used if e.id in in_ram else 0,
            )
        )
    return CacheTree(
        mode,
        tuple(out),
        len(order) - len(shown),
        sum(e.nbytes for e in in_ram.values()),
        sum(e.nbytes for e in on_disk.values()),
    )


def _parent(e: Entry, anchors: list[Entry]) -> Entry | None:
    """The longest anchor of e's namespace that is a proper prefix of e's tokens."""
    if e.role == Role.ANCHOR:
        return None
    best = None
    for a in anchors:
        n = a.length
        if a.namespace != e.namespace or n >= e.length or (best and best.length >= n):
            continue
        if np.array_equal(e.tokens[:n], a.tokens):
            best = a
    return best
