"""Work done on the event loop when it is small, else in a thread: the one place both services make that choice.

Handing work to a thread and back (asyncio.to_thread) costs about 0.2 ms each way on two cores: work cheaper
than that is done where it is (pure-Python work holds the GIL in a thread anyway); anything larger goes to a
thread, so that it never stalls the other streams on the loop. What "small" means is each caller's own bound
(preprocessor.core.INLINE_NORMALIZE_CHARS, engine.llm_engine.INLINE_VALIDATE_TOKENS).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def inline_or_thread(inline: bool, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`: on the calling thread when `inline`, else in a thread."""
    if inline:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)
