"""What the manager knows of the disk tier's files beyond the disk index: which entries
came from a file the model actor may not have read yet (`unread`), which writes were
lost and wait to be ordered again (`unwritten`), and the disk evictions counted.

Each method is one of the manager's disk calls, or the disk half of one: a write the
model actor lost (`files_lost`), files it wrote and their bytes (`file_sizes`), the
lost writes ordered again (`write_lost`), the disk budget kept after a call decided
(`evict`), a file that would not load (`file_failed`). It holds no index of its own
(engine.cache.disk_index is the disk tier's) and decides no RAM eviction.

A file write the model actor could not do (its writer's queue was full, the
disk was) comes back through `files_lost`: the disk index forgets the file,
so it offers no restore point and counts against no budget
(`disk_writes_lost`). The entry stays in RAM, and is ordered written again
as soon as a file is reported written (the manager's `files_written`: the disk
takes writes again), or when it is evicted (spill_on_evict).
"""

from __future__ import annotations

from engine.cache.disk_index import DiskIndex, evict_disk, persist
from engine.cache.index import Index
from engine.cache.orders import OrderBook


class DiskOrders:
    """The disk tier's files as the manager orders them (all no-ops when the tier is off)."""

    def __init__(self, disk_index: DiskIndex | None) -> None:
        self.disk_index = disk_index
        self.unread: set[int] = set()  # entries indexed from a file no commit has restored yet
        self.unwritten: set[int] = set()  # RAM entries whose file write was lost
        self.writes_lost = 0
        self.evictions = 0

    def evict(self, index: Index, orders: OrderBook) -> None:
        """Keep the disk budget: its evictions go into `orders`."""
        self.evictions += len(evict_disk(self.disk_index, index, orders))

    def files_lost(self, entry_ids) -> list[int]:
        """Writes the model actor reports lost: their files leave the disk index. The ids
        it indexed (others were evicted or superseded meanwhile, or never indexed)."""
        out = []
        for entry_id in entry_ids:
            if self.disk_index is not None and entry_id in self.disk_index:
                self.disk_index.remove(entry_id)
                out.append(entry_id)
        self.writes_lost += len(out)
        self.unwritten.update(out)
        return out

    def write_lost(self, index: Index, ours=None) -> OrderBook | None:
        """The writes of the entries still in RAM whose writes were lost, ordered again
        (None: nothing to order); `ours`: only the ids it says are the asking writer's."""
        if self.disk_index is None or not self.unwritten:
            return None
        orders = OrderBook()
        for entry_id in sorted(self.unwritten):
            if ours is not None and not ours(entry_id) and entry_id in index:
                continue
            self.unwritten.discard(entry_id)
            entry = index.get(entry_id)
            if entry is not None:
                persist(self.disk_index, entry, orders)
        self.evict(index, orders)
        return orders

    def file_sizes(self, sizes) -> None:
        """(id, bytes) of files on disk: the disk budget counts each one still indexed at
        its bytes, no longer at the estimate made when its write was ordered."""
        if self.disk_index is not None:
            for entry_id, nbytes in sizes:
                self.disk_index.resize(entry_id, nbytes)

    def file_failed(self, entry_id: int | None) -> None:
        """A file that would not load leaves the disk index, counted damaged."""
        if self.disk_index is not None and entry_id in self.disk_index:
            self.disk_index.remove(entry_id)
            self.disk_index.damaged += 1

    def forget_unread(self, index: Index) -> None:
        """Stop tracking unread entries that left the index and have no free pending."""
        self.unread = {i for i in self.unread if i in index or i in index.deferred}
