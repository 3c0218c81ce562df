"""Answers over HTTP: Server-Sent Events for `stream: true`, one JSON body otherwise; both end the engine
sequence when the client goes away. An answer (preprocessor/answer.py) in the Shape of its endpoint (responses.py).

A streamed answer's status is decided by its first chunk: it is awaited before the 200 goes out, so a
request the core rejects gets its 4xx, not a 200 with an error event. An error after that is one
`data: {"error": ...}` event, then `data: [DONE]`, as vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from preprocessor.answer import Answer, Event
from preprocessor.http.errors import error_body, splice_error_body
from preprocessor.http.json_body import json_response
from preprocessor.http.responses import Shape
from preprocessor.outputs import WholeAnswer
from splice.errors import SpliceError
from splice.offload import gc_paused

log = logging.getLogger(__name__)
T = TypeVar("T")
# A whole answer of up to this many tokens (all choices; with logprobs ~2 KB of JSON each) is built on the loop: less
# time than a thread's hand-off.
INLINE_ANSWER_TOKENS = 256
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


async def respond(request: Request, answer: Answer, shape: Shape, stream: bool) -> Response:
    """The answer whole, or streamed (SSE)."""
    if not stream:
        return await whole_response(request, answer, shape)
    return await stream_response(request, answer.stream(), shape)


async def whole_response(request: Request, answer: Answer, shape: Shape) -> Response:
    """The answer's size is charged to the request's admission before any of it is generated. The body is built in a
    thread, in pieces (json_body.py): an answer of many choices with logprobs is hundreds of MB of JSON."""
    shape.charge(answer)
    whole = await until_disconnected(request, answer.whole())
    small = sum(len(c.joined.token_ids) for c in whole.choices) <= INLINE_ANSWER_TOKENS and \
        not any(c.joined.prompt_logprobs for c in whole.choices)
    if small:
        return json_response(shape.response(whole))
    return await asyncio.to_thread(_built, shape, whole)


def _built(shape: Shape, whole: WholeAnswer) -> Response:
    with gc_paused():  # (millions of small objects: full collections would hold the GIL for most of a second)
        return json_response(shape.response(whole))


def _event(body: dict) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class _SSEResponse(StreamingResponse):
    """Closes its body generator however the response ends (finished, client gone, cancelled)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def stream_response(request: Request, events: AsyncIterator[Event], shape: Shape) -> StreamingResponse:
    try:
        first = await until_disconnected(request, anext(events))
    except BaseException:
        await events.aclose()
        raise
    return _SSEResponse(_events(first, events, shape), media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _events(first: Event, events: AsyncIterator[Event], shape: Shape) -> AsyncIterator[bytes]:
    try:
        for opening in shape.first_chunks():
            yield _event(opening)
        item: Event | None = first
        while item is not None:
            if (body := shape.event(item)) is not None:
                yield _event(body)
            item = await anext(events, None)
    except SpliceError as exc:
        yield _event(splice_error_body(exc)[1])
    except Exception as exc:  # a bug, not the request's fault: still an error event and [DONE], never a cut stream
        log.exception("a streamed answer failed")
        yield _event(error_body(500, f"internal error: {type(exc).__name__}"))
    finally:
        await events.aclose()
    yield DONE
