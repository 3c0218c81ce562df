"""Answers over HTTP: Server-Sent Events for `stream: true`, one JSON body otherwise; both end the engine
sequence when the client goes away.

A streamed answer's status is decided by its first chunk: it is awaited before the 200 goes out, so a
request the core rejects gets its 4xx, not a 200 with an error event. An error after that is one
`data: {"error": ...}` event, then `data: [DONE]`, as vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from preprocessor.http.errors import splice_error_body
from preprocessor.http.responses import Collected, Shape, total_usage
from preprocessor.outputs import GenerationChunk
from splice.engine_output import Usage
from splice.errors import SpliceError

T = TypeVar("T")
DONE = b"data: [DONE]\n\n"


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _disconnected(request: Request) -> None:
    # The body was read already: the next ASGI message is the disconnect (or nothing, until the end).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Runs `work`; cancels it (closing the engine call under it) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ClientGone()
    return task.result()


Indexed = AsyncIterator[tuple[int, GenerationChunk]]  # (choice index, chunk), the core's generate()


async def _collect(chunks: Indexed, n: int) -> list[Collected]:
    collected = [Collected() for _ in range(n)]
    async for i, chunk in chunks:
        collected[i].add(chunk)
    return collected


async def whole_response(request: Request, chunks: Indexed, shape: Shape, n: int = 1) -> JSONResponse:
    """`n`: how many choices `chunks` answers."""
    async with contextlib.aclosing(chunks):
        collected = await until_disconnected(request, _collect(chunks, n))
    return JSONResponse(shape.response(collected))


def _event(body: dict) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class _SSEResponse(StreamingResponse):
    """Closes its body generator however the response ends (finished, client gone, cancelled)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def stream_response(request: Request, chunks: Indexed, shape: Shape) -> StreamingResponse:
    try:
        first = await until_disconnected(request, anext(chunks))
    except BaseException:
        await chunks.aclose()
        raise
    return _SSEResponse(_events(first, chunks, shape), media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _events(first: tuple[int, GenerationChunk], chunks: Indexed, shape: Shape) -> AsyncIterator[bytes]:
    usages: dict[int, Usage] = {}
    try:
        for opening in shape.first_chunks():
            yield _event(opening)
        item: tuple[int, GenerationChunk] | None = first
        while item is not None:
            index, chunk = item
            if chunk.usage is not None:
                usages[index] = chunk.usage
            if (body := shape.chunk(index, chunk)) is not None:
                yield _event(body)
            item = await anext(chunks, None)
        if shape.include_usage:
            yield _event(shape.usage_chunk(total_usage(usages, shape.n)))
    except SpliceError as exc:
        yield _event(splice_error_body(exc)[1])
    finally:
        await chunks.aclose()
    yield DONE
