"""OrderBook: the Orders for the model actor, collected while one call decides."""

from __future__ import annotations

from engine.messages import CheckpointMove, Orders


class OrderBook:
    """Appends moves, checkpoint drops and frees in decision order; builds frozen Orders.

    The model actor applies Orders in field order (moves, drops, frees), so a
    checkpoint moved out of an entry survives that entry's free.
    """

    def __init__(self) -> None:
        self._moves: list[CheckpointMove] = []
        self._drops: list[tuple[int, int]] = []
        self._free: list[int] = []

    def move(self, src: int, length: int, dst: int) -> None:
        self._moves.append(CheckpointMove(src=src, length=length, dst=dst))

    def drop(self, entry_id: int, length: int) -> None:
        self._drops.append((entry_id, length))

    def free(self, entry_id: int) -> None:
        if entry_id not in self._free:
            self._free.append(entry_id)

    def build(self) -> Orders:
        # Disk tier hook: `write` (new entries) and `delete_files` (absorbed or
        # evicted entries, once the successor's file is written) go here.
        return Orders(
            moves=tuple(self._moves), drop_checkpoints=tuple(self._drops), free=tuple(self._free)
        )
