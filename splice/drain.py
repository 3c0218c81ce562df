"""Graceful drain: on SIGTERM a server stops taking new splice.v1 calls (UNAVAILABLE, so clients and balancers
retry elsewhere) while its health says NOT_SERVING, and lets the calls already running finish within a grace
period before it stops. Health keeps answering throughout: the listener stays open until the end.

Every splice.v1 call enters and leaves through splice.call_guard.CallGuard, inside its error mapping, which
turns the refusal into its status.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from splice.errors import Unavailable

DEFAULT_GRACE = 20.0  # seconds running calls get to finish after SIGTERM


class Drain:
    def __init__(self) -> None:
        self.in_flight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._watchers: set[Callable[[], None]] = set()  # told when the drain starts (long-lived streams)

    def watch(self, told: Callable[[], None]) -> None:
        """`told()` is called when the drain starts: a stream that carries many calls ends once they are done."""
        self._watchers.add(told)

    def unwatch(self, told: Callable[[], None]) -> None:
        self._watchers.discard(told)

    def enter(self) -> None:
        """A new call: Unavailable once draining."""
        if self.draining:
            raise Unavailable("the server is shutting down; retry on another replica or after it restarts")
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def drain(self, grace: float) -> int:
        """Refuses new calls from now on; returns once the running ones finished or `grace` seconds passed,
        with the number still running (the caller cancels them by stopping the server)."""
        self.draining = True
        for told in list(self._watchers):
            told()
        deadline = time.monotonic() + grace
        while self.in_flight and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self._idle.wait(), deadline - time.monotonic())
            except TimeoutError:
                break
        return self.in_flight
