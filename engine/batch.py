"""The running batch: each row's keys and values in a slot of the per-layer buffers (engine/models/slot_cache.py), the
family's own state per row (recurrent layers: engine/models/hybrid_cache.py) and each row's next position, and the
row operations that keep the three in step: copying a row (an n > 1 request's choices), two rows trading slots (rows
whose reader fell behind wait after the decoded ones, engine/flow.py), rows leaving (the last row fills a leaving
slot, so nothing else moves)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.models.slot_cache import SlotKV


@dataclass
class Batch:
    """The running rows (slots 0 .. rows - 1 of `kv`) and any prompt's columns being prefilled after them. `ops`
    arguments: the family's row operations on its cache (`ModelFamily.cache`)."""

    cache: Any  # the family's cache over the slots in use
    kv: SlotKV  # the slot table and key/value buffers
    positions: torch.Tensor  # [rows] long; position id of each row's next token

    def fork(self, ops: Any, slot: int, copies: int) -> list[int]:
        """New rows after the rows in use, each a copy of `slot`'s row as it stands (its key/value columns, its
        family's states, its next position) -> their slots. From here on every row is on its own. On an exception (a
        buffer that cannot grow) the batch is as it was."""
        rows = self.kv.rows
        try:
            for _ in range(copies):
                self.kv.fork(slot)
            ops.fork(self.cache, slot, copies)
        except BaseException:
            self.kv.truncate(rows)
            ops.truncate(self.cache, rows)
            self.kv.refresh()
            raise
        self.positions = torch.cat([self.positions, self.positions[slot:slot + 1].expand(copies)])
        return list(range(rows, rows + copies))

    def swap(self, ops: Any, a: int, b: int) -> None:
        """Rows `a` and `b` trade slots (their columns, family states and positions)."""
        self.kv.swap(a, b)
        ops.swap(self.cache, a, b)
        self.positions[[a, b]] = self.positions[[b, a]]
        self.kv.refresh()

    def remove(self, ops: Any, slots: list[int]) -> dict[int, int]:
        """Drops the rows in `slots` (a slot past the rows in use, a prompt's that never joined, holds nothing to
        drop): each leaving slot takes the last slot's row, and the slot count shrinks. Returns where the rows that
        moved went (old slot -> new slot)."""
        kv = self.kv
        rows = kv.rows
        came_from: dict[int, int] = {}  # slot -> the slot its row was in before this call, for rows that moved
        for slot in sorted({s for s in slots if s < rows}, reverse=True):  # the highest first: no leaver moves
            rows -= 1
            if slot != rows:
                kv.move(rows, slot)
                ops.move(self.cache, rows, slot)
                self.positions[slot] = self.positions[rows]
                came_from[slot] = came_from.pop(rows, rows)
        ops.truncate(self.cache, rows)
        self.positions = self.positions[:rows]
        kv.truncate(rows)
        kv.refresh()
        return {old: new for new, old in came_from.items()}
