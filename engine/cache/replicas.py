"""Several model replicas behind one cache manager: placement, load, routing, orders per replica.

The index (engine.cache.index) is one for the whole engine: an entry id means
the same tensors wherever they are. This module knows where they are (which
replica holds each entry in RAM, which replica wrote each file) and how busy
each replica is, measured in queued prefill tokens, not requests. It routes a
plan to the replica holding its restore point unless that replica is busier
than the least loaded one by more than `threshold` tokens; the least loaded
one then fetches the restore point from a holder (`RestorePlan.fetch_from`).
A request that names its session (engine.cache.sessions) goes to the replica
that served that session last, under the same threshold, fetching its restore
point there if that replica lacks it.
The manager decides and the replicas obey: a replica never asks another what
it holds.

`Replicas` is this bookkeeping; engine.cache.replicated composes it with the
CacheManager (`ReplicatedCache`, the facade the actor wraps).

Plain Python (no MLX, no Ray), like the rest of engine.cache.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from engine.cache.messages import (
    Orders,
    ReplicaStats,
    RestorePlan,
)
from engine.cache.sessions import Sessions

DEFAULT_THRESHOLD = 4096  # queued prefill tokens


@dataclass
class _Flight:
    replica: int
    queued: int  # prefill tokens still counted in the replica's load
    plan: RestorePlan


@dataclass
class _Replica:
    alive: bool = True
    load: int = 0  # queued prefill tokens
    requests: int = 0
    restores: Counter = field(default_factory=Counter)
    handovers: int = 0
    handover_bytes: int = 0


class Replicas:
    """Who holds which entry, who wrote which file, and each replica's queued prefill tokens."""

    def __init__(self, count: int, threshold: int = DEFAULT_THRESHOLD) -> None:
        if count < 1:
            raise ValueError(f"replicas must be >= 1, got {count}")
        if threshold < 0:
            raise ValueError(f"route threshold must be >= 0, got {threshold}")
        self.threshold = threshold
        self.replicas = [_Replica() for _ in range(count)]
        self.holders: dict[int, set[int]] = {}  # entry id -> replicas holding it in RAM
        self.writers: dict[int, int] = {}  # entry id -> replica whose writer owns its file
        self.durable: set[int] = set()  # files their writer reported written (`written`)
        self.unwritten: list[int] = []  # writes no replica could do (`split`), not taken yet
        # The machine of each replica, and of the files found at start (the manager's):
        # replicas of one machine share its cache directory; another machine's file is
        # fetched from a replica there, like a RAM entry.
        self.machines: list[str] = [""] * count
        self.home = ""
        self.flights: dict[str, _Flight] = {}
        self.sessions = Sessions()

    @property
    def count(self) -> int:
        return len(self.replicas)

    def alive(self) -> list[int]:
        return [r for r, rep in enumerate(self.replicas) if rep.alive]

    def load(self, replica: int) -> int:
        return self.replicas[replica].load

    def readers(self, entry_id: int) -> list[int]:
        """Live replicas that may read the entry's file, least loaded first: its writer alone
        while the write is not reported durable (it may still be queued there, and only the
        writer's own reader sees that queue), else every live replica of the file's machine
        (a dead writer's queue is gone: the file is there or it never will be)."""
        writer = self.writers.get(entry_id)
        if writer is not None and entry_id not in self.durable and self.replicas[writer].alive:
            return [writer]
        machine = self.machine_of(entry_id)
        live = [r for r in self.alive() if self.machines[r] == machine]
        return sorted(live, key=lambda r: (self.replicas[r].load, r))

    def machine_of(self, entry_id: int) -> str:
        """The machine of the entry's file: its writer's, else this one (found at start)."""
        writer = self.writers.get(entry_id)
        return self.machines[writer] if writer is not None else self.home

    def held_by(self, entry_id: int | None) -> list[int]:
        """Live replicas holding `entry_id` in RAM, least loaded first."""
        live = [r for r in self.holders.get(entry_id, ()) if self.replicas[r].alive]
        return sorted(live, key=lambda r: (self.replicas[r].load, r))

    # -- routing -------------------------------------------------------------

    def route(
        self,
        request_id: str,
        plan: RestorePlan,
        prompt_len: int,
        exclude=(),
        nbytes: int = 0,
        session: tuple[str, str] | None = None,
    ) -> RestorePlan:
        """Place a planned request; the plan with `replica` (and `fetch_from`) set.

        Affinity when balanced: the replica that served the request's session
        (`session`: (namespace, key)) last, else the least loaded holder of the
        restore source, unless that one is busier than the least loaded
        replica by more than the threshold; then the least loaded replica.
        Whichever runs it fetches the source from a holder when it has none. A
        source read from disk is held by every replica of the file's machine:
        each reads the shared directory. Raises LookupError when no replica is
        left to run it.
        """
        candidates = [r for r in self.alive() if r not in exclude]
        if not candidates:
            raise LookupError("no model replica is alive")
        least = min(candidates, key=lambda r: (self.replicas[r].load, r))
        if plan.load_from_disk:  # replicas on the file's machine read it themselves
            holders = self.readers(plan.entry_id)
        else:
            holders = [] if plan.entry_id is None else self.held_by(plan.entry_id)
        near = [r for r in holders if r in candidates]
        home = self.sessions.get(*session) if session else None
        if home in candidates and self._balanced(home, least):
            chosen = home
        elif near and self._balanced(near[0], least):
            chosen = near[0]
        else:
            chosen = least
        # A dead or excluded holder answers no fetch: holders are live.
        fetch = holders[0] if holders and chosen not in holders else None
        if session and self.count > 1:  # one replica: nothing to route, nothing to remember
            self.sessions.served(*session, chosen)
        rep = self.replicas[chosen]
        queued = max(0, prompt_len - plan.length)
        rep.load += queued
        rep.requests += 1
        rep.restores[str(plan.kind)] += 1
        if fetch is not None:
            rep.handovers += 1
            rep.handover_bytes += nbytes
        if plan.entry_id is not None and (fetch is not None or plan.load_from_disk):
            self.holders.setdefault(plan.entry_id, set()).add(chosen)
        for entry_id in _allocated(plan):
            self.holders.setdefault(entry_id, set()).add(chosen)
        plan = replace(plan, replica=chosen, fetch_from=fetch)
        self.flights[request_id] = _Flight(chosen, queued, plan)
        return plan

    def _balanced(self, replica: int, least: int) -> bool:
        return self.replicas[replica].load - self.replicas[least].load <= self.threshold

    def prefilled(self, request_id: str) -> None:
        """The request's prefill is done: its tokens leave its replica's queue.

        A request with nothing to commit (cache off) is done with here.
        """
        flight = self.flights.get(request_id)
        if flight is not None:
            self.replicas[flight.replica].load -= flight.queued
            flight.queued = 0
            if flight.plan.new_entry_id is None:
                del self.flights[request_id]

    def finish(self, request_id: str) -> int | None:
        """The request committed or was released; its replica (None: unknown request).

        The holders stay as routed: a replica that fetched the source stored it,
        whatever became of the request (a cancel, a release at its first token),
        and only a free that reaches it takes it out of its tier. A fetch that
        failed leaves a holder listed that holds nothing, which is harmless: its
        restore is lost and replanned, and a free of an entry it lacks does nothing.
        """
        flight = self.flights.pop(request_id, None)
        if flight is None:
            return None
        self.replicas[flight.replica].load -= flight.queued
        return flight.replica

    # -- orders ----------------------------------------------------------------

    def split(self, orders: Orders, caller: int | None) -> dict[int, Orders]:
        """The Orders each replica must apply: frees and drops to every holder, a file's
        write to one holder (its writer from then on), its delete to that writer.

        A write nobody can do (no replica holds the entry) goes to `unwritten`
        (the caller forgets its file) and the files it superseded are deleted now.
        """
        books: dict[int, dict[str, list]] = {}

        def book(r: int) -> dict[str, list]:
            return books.setdefault(r, {k: [] for k in _FIELDS})

        fallback = caller if caller is not None else (self.alive() or [0])[0]
        if caller is not None:
            book(caller)  # the caller gets its Orders' number even when they are empty
        for move in orders.moves:
            for r in self.holders.get(move.dst) or {fallback}:
                book(r)["moves"].append(move)
        for entry_id, length in orders.drop_checkpoints:
            for r in self.holders.get(entry_id, ()):
                book(r)["drop_checkpoints"].append((entry_id, length))
        for entry_id in orders.rejoin:
            for r in self.holders.get(entry_id) or {fallback}:
                book(r)["rejoin"].append(entry_id)
        deletes = list(orders.delete_files)
        for record in orders.records:
            held = self.holders.get(record.entry_id, set())
            live = [r for r in sorted(held) if self.replicas[r].alive]
            writer = caller if caller in held else (live or sorted(held) or [None])[0]
            if writer is None:  # nobody holds it: its file will never exist
                self.unwritten.append(record.entry_id)
                deletes += record.supersedes
                continue
            kept, now = self._superseded(record.supersedes, writer)
            deletes += now
            self.writers[record.entry_id] = writer
            self.durable.discard(record.entry_id)
            book(writer)["write"].append(record.entry_id)
            book(writer)["records"].append(replace(record, supersedes=kept))
        for entry_id in orders.free:
            for r in self.holders.pop(entry_id, ()):
                book(r)["free"].append(entry_id)
        for entry_id in deletes:
            book(self._deleter(entry_id, fallback))["delete_files"].append(entry_id)
        return {
            r: Orders(**{k: tuple(v) for k, v in b.items()}, seq=orders.seq)
            for r, b in books.items()
        }

    def _superseded(self, old: tuple[int, ...], writer: int) -> tuple[tuple[int, ...], list[int]]:
        """The files a new file of `writer` replaces: (those its writer deletes once the new
        file is durable, those deleted now by their own writer).

        `writer` deletes a file only in its own directory, and only when no other
        live writer may still have that file's write queued (it is its own, or
        durable, or its writer is dead). Any other goes to its own writer now,
        whose queue drops the write if it has not started, so no file is left
        behind in another directory or written after its delete.
        """
        kept, now = [], []
        for entry_id in old:
            owner = self.writers.get(entry_id)
            settled = owner is None or entry_id in self.durable or not self.replicas[owner].alive
            here = self.machine_of(entry_id) == self.machines[writer]
            if owner == writer or (settled and here):
                kept.append(entry_id)
                self.writers.pop(entry_id, None)
                self.durable.discard(entry_id)
            else:
                now.append(entry_id)
        return tuple(kept), now

    def _deleter(self, entry_id: int, fallback: int) -> int:
        """The replica that deletes the entry's file: its writer, else (dead or unknown) a
        live replica of the file's machine; it owns the file no more."""
        machine = self.machine_of(entry_id)
        writer = self.writers.pop(entry_id, None)
        self.durable.discard(entry_id)
        if writer is not None and self.replicas[writer].alive:
            return writer
        return next((r for r in self.alive() if self.machines[r] == machine), fallback)

    def forget_file(self, entry_id: int) -> None:
        """The entry's file left the disk index with no delete to order (lost, damaged): no
        writer owns it any more."""
        self.writers.pop(entry_id, None)
        self.durable.discard(entry_id)

    def written(self, entry_ids, replica: int) -> None:
        """`replica`'s writer reports these files durable: any replica of the machine may read
        them now."""
        self.durable.update(i for i in entry_ids if self.writers.get(i) == replica)

    # -- faults ----------------------------------------------------------------

    def lost(self, replica: int) -> tuple[list[int], list[str]]:
        """A replica died or stopped answering: what it held is gone (it is reset before it
        serves again). Returns (the entry ids no replica holds now, the requests that
        were running there: the caller gives them back)."""
        rep = self.replicas[replica]
        rep.alive, rep.load = False, 0
        orphans = []
        for entry_id, held in list(self.holders.items()):
            if replica in held:
                held.discard(replica)
                if not held:
                    del self.holders[entry_id]
                    orphans.append(entry_id)
        requests = [rid for rid, flight in self.flights.items() if flight.replica == replica]
        for request_id in requests:
            del self.flights[request_id]
        return orphans, requests

    def revived(self, replica: int, machine: str | None = None) -> None:
        """A replica is back, reset (empty); `machine`: where it runs now, if it moved."""
        self.replicas[replica].alive = True
        if machine:
            self.machines[replica] = machine

    def check(self, indexed) -> None:
        """Assert the placement's invariants: every indexed entry (`indexed`, ids) has a live
        holder, and every request in flight runs on a live replica."""
        for entry_id in indexed:
            held = self.holders.get(entry_id, set())
            assert any(self.replicas[r].alive for r in held), f"entry {entry_id} has no holder"
        for request_id, flight in self.flights.items():
            assert self.replicas[flight.replica].alive, (request_id, flight.replica)

    def stats(self, nbytes) -> tuple[ReplicaStats, ...]:
        """Figures per replica; `nbytes(entry_id)` gives an indexed entry's bytes (None: not)."""
        out = []
        sessions = self.sessions.counts()
        for r, rep in enumerate(self.replicas):
            held = [n for e, h in self.holders.items() if r in h for n in [nbytes(e)] if n]
            out.append(
                ReplicaStats(
                    replica=r,
                    alive=rep.alive,
                    entries=len(held),
                    ram_bytes=sum(held),
                    queued_prefill_tokens=rep.load,
                    in_flight=sum(f.replica == r for f in self.flights.values()),
                    requests=rep.requests,
                    restores=dict(sorted(rep.restores.items())),
                    handovers=rep.handovers,
                    handover_bytes=rep.handover_bytes,
                    sessions=sessions[r],
                    session_moves=self.sessions.moves[r],
                )
            )
        return tuple(out)


_FIELDS = ("moves", "drop_checkpoints", "free", "rejoin", "write", "delete_files", "records")


def _allocated(plan: RestorePlan) -> list[int]:
    ids = [plan.new_entry_id] + [c.entry_id for c in plan.captures]
    return [i for i in ids if i is not None]
