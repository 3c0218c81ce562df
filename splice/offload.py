"""Work done on the event loop when it is small, else in a thread: the one place both services make that choice; and
the cyclic garbage collector paused while such work builds a large tree of objects (`gc_paused`).

Handing work to a thread and back (asyncio.to_thread) costs about 0.2 ms each way on two cores: work cheaper
than that is done where it is (pure-Python work holds the GIL in a thread anyway); anything larger goes to a
thread, so that it never stalls the other streams on the loop. What "small" means is each caller's own bound
(preprocessor.core.INLINE_NORMALIZE_CHARS, engine.llm_engine.INLINE_VALIDATE_TOKENS).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def inline_or_thread(inline: bool, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`: on the calling thread when `inline`, else in a thread."""
    if inline:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


_gc_lock = threading.Lock()
_gc_pauses = 0  # builds under way that paused the collector
_gc_was_on = True  # the collector's state before the first of them


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a large acyclic tree of objects is built (a parsed body, a whole answer's
    JSON): each full collection walks every object alive, and holds the GIL meanwhile (0.7 s pauses, and twice the
    build's time, for a 30 MB answer with logprobs). Such a tree holds no cycle: reference counting frees it. The
    collector is back on when the last build that paused it ends."""
    global _gc_pauses, _gc_was_on
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_on = gc.isenabled()
        _gc_pauses += 1
        gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_on:
                gc.enable()
