"""OrderBook: the Orders for the model actor, collected while one call decides; Outbox:
the manager's numbering of the Orders it hands out, and the frees that wait for the next."""

from __future__ import annotations

from dataclasses import replace

from engine.cache.entry import Entry
from engine.cache.messages import CheckpointMove, EntryRecord, Orders


class OrderBook:
    """Appends moves, checkpoint drops, frees, file writes and deletes; builds frozen Orders.

    The model actor applies Orders as moves, drops, writes, frees, deletes, so a
    checkpoint moved out of an entry survives that entry's free, a write sees
    the entry after its moves and drops (and before a spill's free), and a
    superseded file goes after its successor's write.
    """

    def __init__(self) -> None:
        self._moves: list[CheckpointMove] = []
        self._drops: list[tuple[int, int]] = []
        self._free: list[int] = []
        self._rejoin: list[int] = []
        self._writes: dict[int, EntryRecord] = {}
        self._deletes: list[int] = []

    def move(self, src: int, length: int, dst: int) -> None:
        self._moves.append(CheckpointMove(src=src, length=length, dst=dst))

    def drop(self, entry_id: int, length: int) -> None:
        self._drops.append((entry_id, length))

    def free(self, entry_id: int) -> None:
        if entry_id not in self._free:
            self._free.append(entry_id)

    def rejoin(self, entry_id: int) -> None:
        """`entry_id` holds every row from now on (its prefix entry leaves)."""
        if entry_id not in self._rejoin:
            self._rejoin.append(entry_id)

    def unfree(self, entry_id: int) -> bool:
        """Take back a free not handed out yet (the entry is indexed again)."""
        if entry_id in self._free:
            self._free.remove(entry_id)
            return True
        return False

    def write(self, entry: EntryRecord) -> None:
        """Write an entry's file (the latest of a write and a delete of one id wins)."""
        if entry.entry_id in self._deletes:
            self._deletes.remove(entry.entry_id)
        self._writes[entry.entry_id] = entry

    def delete_file(self, entry_id: int) -> None:
        dropped = self._writes.pop(entry_id, None)
        if entry_id not in self._deletes:
            self._deletes.append(entry_id)
        for superseded in dropped.supersedes if dropped else ():
            self.delete_file(superseded)  # the successor's write will not happen

    def supersede(self, entry_id: int, old: int) -> None:
        """Delete `old`'s file once the file of `entry_id` (ordered here) is durable."""
        record = self._writes[entry_id]
        self._writes[entry_id] = replace(record, supersedes=(*record.supersedes, old))

    def writes(self, entry_id: int) -> bool:
        return entry_id in self._writes

    def build(self, seq: int = 0) -> Orders:
        return Orders(
            seq=seq,
            moves=tuple(self._moves),
            drop_checkpoints=tuple(self._drops),
            free=tuple(self._free),
            rejoin=tuple(self._rejoin),
            write=tuple(self._writes),
            delete_files=tuple(self._deletes),
            records=tuple(self._writes.values()),
        )


class Outbox:
    """The Orders the manager hands out, numbered, and the frees that wait for the next.

    A plan that loads a file evicts for its entry, but hands nothing out: those frees
    wait in `pending` (with the entries they free, `held`) until the next call that
    answers with Orders (a commit, a release, `room`) takes them. A later plan that
    restores one of those entries takes its free back (`take_back`): the model actor
    still holds it. Every Orders handed out carries the next number (`seq`), which a
    plan quotes as the last one before it (RestorePlan.after_orders).
    """

    def __init__(self) -> None:
        self.seq = 0  # the number of the last Orders handed out
        self.pending = OrderBook()  # evictions made at a plan, ordered with the next Orders
        self.held: dict[int, Entry] = {}  # the entries `pending` frees

    def take(self) -> OrderBook:
        """The pending orders, to add this call's to; the outbox starts a fresh book."""
        orders, self.pending = self.pending, OrderBook()
        self.held = {}
        return orders

    def hold(self, entries, deferred) -> None:
        """Remember the entries whose frees wait in `pending` (those in `deferred` stay
        deferred: their free waits for a pin, not for the next Orders)."""
        for entry in entries:
            if entry.id not in deferred:
                self.held[entry.id] = entry

    def take_back(self, entry_id: int | None) -> Entry | None:
        """The entry a pending free would have freed, its free taken back (None: none
        was pending, so the model actor may not hold it)."""
        held = self.held.pop(entry_id, None)
        return held if self.pending.unfree(entry_id) else None

    def hand_out(self, orders: OrderBook) -> Orders:
        """The Orders built and numbered."""
        self.seq += 1
        return orders.build(self.seq)
