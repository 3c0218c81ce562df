"""Engine thread -> event loops: one hand-off per step per loop, and one merged output per stream per wake-up.

The engine thread appends (listener, item) pairs while it holds the engine lock; `Outbox.flush` then sends
each event loop ONE callback carrying all of that loop's pairs, instead of one `call_soon_threadsafe` per
token per listener. On the loop, each listener keeps a plain list of pending items and at most one waiting
future: a consumer that was busy (a slow gRPC reader, a saturated loop) finds several outputs pending and
takes them as one merged EngineOutput, so a reader that falls behind gets fewer, larger messages and never a
lost or reordered token.

With a stream interval N (--stream-interval), the consumer is woken for its first output, then only once N tokens
are pending, or the stream ended: the merging above, on purpose, so each hop carries about 1/N of the messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.flow import Flow
from splice.engine_output import EngineOutput

Item = EngineOutput | BaseException  # an exception ends the stream (error, abort, engine stopped)


@dataclass(eq=False)
class Listener:
    """Where one sequence's outputs go. Everything but `loop`, `interval` and `flow` is touched only on `loop`."""

    loop: asyncio.AbstractEventLoop
    interval: int = 1  # tokens to collect before waking the consumer again, once its first output went out
    flow: Flow | None = None  # its request's (engine/flow.py): what the consumer takes counts as read, when `auto`
    pending: list[Item] = field(default_factory=list)
    pending_tokens: int = 0
    started: bool = False  # the consumer has taken something
    waiter: asyncio.Future | None = None  # set while the consumer waits for the next item

    def ready(self) -> bool:
        """The consumer should take what is pending: the first output, an interval's worth, or the stream's end."""
        if not self.pending:
            return False
        last = self.pending[-1]
        return (not self.started or self.pending_tokens >= self.interval or isinstance(last, BaseException)
                or last.finished or (self.flow is not None and self.flow.behind))  # (paused: it waits for this take)

    def deliver(self, item: Item) -> None:
        """On the loop."""
        self.pending.append(item)
        if isinstance(item, EngineOutput):
            self.pending_tokens += len(item.token_ids)
        if self.waiter is not None and not self.waiter.done() and self.ready():
            self.waiter.set_result(None)

    async def take(self) -> tuple[EngineOutput | None, BaseException | None]:
        """Waits until `ready`; returns every pending output merged into one (None if the first item is an
        exception) and the exception that follows them, if any. Items after an exception never exist: it is the
        last thing a sequence sends."""
        while not self.ready():
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        items, tokens = self.pending, self.pending_tokens
        self.pending, self.pending_tokens, self.started = [], 0, True
        if self.flow is not None and self.flow.auto and tokens:
            self.flow.add_read(tokens)
        error = items[-1] if isinstance(items[-1], BaseException) else None
        outputs = items[:-1] if error is not None else items
        return (EngineOutput.merge(outputs) if outputs else None), error


def _deliver_all(batch: list[tuple[Listener, Item]]) -> None:
    for listener, item in batch:
        listener.deliver(item)


class Outbox:
    """Collects a step's items on the engine thread (callers hold the engine lock) and hands them over."""

    def __init__(self) -> None:
        self._items: list[tuple[Listener, Item]] = []

    def put(self, listener: Listener, item: Item) -> None:
        self._items.append((listener, item))

    def take(self) -> dict[asyncio.AbstractEventLoop, list[tuple[Listener, Item]]]:
        """Under the engine lock: everything collected, grouped by event loop (order kept within each)."""
        items, self._items = self._items, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Listener, Item]]] = {}
        for pair in items:
            by_loop.setdefault(pair[0].loop, []).append(pair)
        return by_loop

    @staticmethod
    def send(by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Listener, Item]]]) -> None:
        """Lock not needed: one call_soon_threadsafe per loop."""
        for loop, batch in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that event loop is already closed
                loop.call_soon_threadsafe(_deliver_all, batch)


class Waiters:
    """Callers on event loops waiting for the engine thread to do something at a step boundary (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def __bool__(self) -> bool:
        return bool(self._waiting)

    async def wait(self, wake: Callable[[], None]) -> None:
        """On the caller's loop: waits until `answer` (`wake`: wakes the engine thread)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        with self._lock:
            self._waiting.append((loop, done))
        wake()
        await done

    def answer(self) -> None:
        """On the engine thread: ends the waits so far (each on its own loop)."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for loop, done in waiting:
            loop.call_soon_threadsafe(lambda f=done: f.done() or f.set_result(None))
