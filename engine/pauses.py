"""The requests the engine holds back because their readers fell behind (engine/flow.py): since when each is paused
(one paused --unread-timeout or longer is cancelled, and an idle engine wakes when the first would be), and the rows
a step decodes put in the first slots, the paused ones after them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.flow import Flow

if TYPE_CHECKING:
    from engine.sequence import Sequence


class Pauses:
    """The requests paused at the last schedule and since when (the engine thread's): one paused --unread-timeout or
    longer is to be cancelled, and an idle engine wakes when the first would be."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.flows: set[Flow] = set()

    def note(self, paused: list[Sequence]) -> list[list[Sequence]]:
        """`paused`: the sequences this schedule left out -> the sequences of each request paused too long."""
        now = time.monotonic()
        flows = {s.flow for s in paused}
        for flow in self.flows - flows:
            flow.paused_since = None  # it read: a later pause starts afresh
        expired = set()
        for flow in flows:
            if flow.paused_since is None:
                flow.paused_since = now
            elif now - flow.paused_since >= self.timeout:
                expired.add(flow)
        self.flows = flows - expired
        return [[s for s in paused if s.flow is flow] for flow in expired]

    def left(self) -> float | None:
        """Seconds until the first pause reaches the timeout (None: none is paused)."""
        if not self.flows:
            return None
        first = min(f.paused_since for f in self.flows if f.paused_since is not None)
        return max(0.0, first + self.timeout - time.monotonic()) + 0.01


def arrange(decode: list[Sequence], running: list[Sequence], swap: Callable[[int, int], None]) -> None:
    """Puts the rows `decode` in the first slots (the runner decodes the first rows; paused ones wait after them),
    swapping (`swap`: the runner's) each that is not with a paused row that is: none while no reader is behind."""
    k = len(decode)
    movers = [s for s in decode if s.slot >= k]
    if not movers:
        return
    decoding = set(decode)
    holes = sorted((s for s in running if s.slot is not None and s.slot < k and s not in decoding),
                   key=lambda s: s.slot)
    for seq, other in zip(movers, holes, strict=True):
        swap(seq.slot, other.slot)
        seq.slot, other.slot = other.slot, seq.slot
