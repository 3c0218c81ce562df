"""Several answer streams as one: the choices of a request that holds several prompts (OpenAI's batch form of
/v1/completions) are generated side by side and reach the client as they come, each item tagged with its
stream's index, as vLLM's merge_async_iterators does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import TypeVar

T = TypeVar("T")


async def merge_streams(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(index, item) from every stream as each arrives; ends when all have ended. The first error raised by
    any stream ends the merge; closing it (or an error) cancels and closes every stream still open."""
    if len(streams) == 1:  # the common case: no task per item
        async with aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return
    pending: dict[asyncio.Future, int] = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):  # same-time items in stream order
                i = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(streams[i]))] = i
                yield i, item
    finally:
        # A stream's anext must be finished (cancelled) before the stream can be closed.
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
