"""What `lineage bench faults` checks every second: the RAM tiers and the files against the index.

Three reads of a live engine: the cache manager's `audit()` (what its index
counts, where, and whether its invariants hold), each model replica's
holdings (what its RAM tier holds, read on its loop thread, and what its disk
writer still has queued) and the entry files in the cache directory.
`compare` turns them into findings:

- leaked: an entry a replica's RAM tier holds that the manager does not place
  there (RAM outside the budget);
- miscounted: an entry whose bytes in the tier are not the index's;
- drift: a tier whose running total is not the sum of its entries;
- orphans: a file on disk the disk index does not hold (and no delete of it
  is queued): disk outside the budget;
- unwritten: a file the disk index holds that is neither on disk nor queued
  at a writer (a restore from it would fail);
- violation: the manager's invariants (`check_invariants`) fail.

Messages are in flight at any instant (Orders on their way, a replica
resetting), so one finding proves nothing; `Lasting` keeps those found in
`after` checks in a row. Plain Python: the actor reads are the caller's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Holdings:
    """What one model replica holds now."""

    replica: int
    entries: dict[int, int]  # entry id -> bytes in its RAM tier
    tier_bytes: int  # the tier's running total (RamTier.nbytes)
    loads: int  # file reads it holds for waiting requests
    writes: tuple[int, ...] = ()  # files its writer has queued or is writing
    deletes: tuple[int, ...] = ()  # files its writer is still to delete


def read_holdings(actor) -> dict | None:
    """Run on a model actor (`actor.__ray_call__.remote(read_holdings)`): its RAM tier and
    its writer's queue, as plain values (None: its model is not loaded yet).

    Read beside the loop thread, never waiting for it (a sync call blocks the actor's
    event loop, and with it the supervisor's ping): the tier's table is copied in one
    step under the GIL, so a read may fall between two changes of one loop call, which
    `Lasting` tells from a lasting finding.
    """
    g = actor.loop.generator
    if g is None:
        return None
    entries = dict(g.tier.entries)  # one C-level copy: no change of the table half-seen
    disk = g.tier.disk_tier
    writes, deletes = disk.queued() if disk is not None else ((), ())
    return {
        "entries": {i: e.nbytes for i, e in entries.items()},
        "tier_bytes": g.tier.nbytes,
        "loads": g.tier.loads,
        "writes": writes,
        "deletes": deletes,
    }


def entry_files(directory: str | Path) -> set[int]:
    """The ids of the entry files in an entries directory (temporary and quarantined files
    left out)."""
    out = set()
    for path in Path(directory).glob("*.entry"):
        try:
            out.add(int(path.stem))
        except ValueError:
            pass
    return out


@dataclass(frozen=True)
class Findings:
    leaked: dict = field(default_factory=dict)  # (replica, entry id) -> bytes
    miscounted: dict = field(default_factory=dict)  # (replica, entry id) -> (tier, index) bytes
    drift: dict = field(default_factory=dict)  # replica -> (running total, sum of entries)
    orphans: dict = field(default_factory=dict)  # file id -> 1
    unwritten: dict = field(default_factory=dict)  # file id -> 1
    violation: str = ""

    def __bool__(self) -> bool:
        return bool(
            self.leaked
            or self.miscounted
            or self.drift
            or self.orphans
            or self.unwritten
            or self.violation
        )


def compare(audit, holdings: list[Holdings], files: set[int]) -> Findings:
    """The findings of one check. `holdings`: the replicas read (a replica that did not
    answer is left out: its queue is unknown, so nothing on disk is held against it)."""
    placed = {(r, i): audit.ram[i] for i, rs in audit.holders.items() for r in rs}
    leaked, miscounted, drift = {}, {}, {}
    for h in holdings:
        for entry_id, nbytes in h.entries.items():
            key = (h.replica, entry_id)
            if key not in placed:
                leaked[key] = nbytes
            elif nbytes != placed[key]:
                miscounted[key] = (nbytes, placed[key])
        if h.tier_bytes != sum(h.entries.values()):
            drift[h.replica] = (h.tier_bytes, sum(h.entries.values()))
    writes = {i for h in holdings for i in h.writes}
    deletes = {i for h in holdings for i in h.deletes}
    indexed = set(audit.disk)
    orphans = files - indexed - deletes
    unwritten = indexed - files - writes
    return Findings(
        leaked,
        miscounted,
        drift,
        dict.fromkeys(sorted(orphans), 1),
        dict.fromkeys(sorted(unwritten), 1),
        audit.violation,
    )


class Lasting:
    """The findings seen in `after` checks in a row: what no message in flight explains."""

    KINDS = ("leaked", "miscounted", "drift", "orphans", "unwritten")

    def __init__(self, after: int) -> None:
        self.after = after
        self.streaks: dict[str, Counter] = {k: Counter() for k in self.KINDS}
        self.lasting: dict[str, dict] = {k: {} for k in self.KINDS}
        self.violations: list[str] = []  # every failed invariant (each is a bug: no streak)
        self.checks = 0

    def see(self, found: Findings) -> None:
        self.checks += 1
        if found.violation:
            self.violations.append(found.violation)
        for kind in self.KINDS:
            now, streak = getattr(found, kind), self.streaks[kind]
            for key in [k for k in streak if k not in now]:
                del streak[key]
            for key, value in now.items():
                streak[key] += 1
                if streak[key] >= self.after:
                    self.lasting[kind][key] = value

    @property
    def leaked_bytes(self) -> int:
        return sum(self.lasting["leaked"].values())

    def figures(self) -> dict:
        return {
            "checks": self.checks,
            "lasting_after_checks": self.after,
            "leaked_bytes": self.leaked_bytes,
            "leaked_entries": len(self.lasting["leaked"]),
            "miscounted_entries": len(self.lasting["miscounted"]),
            "drifting_tiers": len(self.lasting["drift"]),
            "orphaned_files": len(self.lasting["orphans"]),
            "unwritten_files": len(self.lasting["unwritten"]),
            "invariant_violations": len(self.violations),
            "first_violation": self.violations[0] if self.violations else "",
        }
