"""OrderBook: the Orders for the model actor, collected while one call decides."""

from __future__ import annotations

from dataclasses import replace

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
