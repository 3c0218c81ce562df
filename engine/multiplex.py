"""One Multiplex stream on the engine: many GenerateWhole calls, their outputs sent as one message per engine step.

Per-request calls cost the engine process one gRPC message write per running stream per step, and each write
holds the GIL the engine thread needs between its forwards. Here a step's outputs for every call on the stream
become ONE MultiplexResponse (vLLM's engine core, TGI's router and SGLang's scheduler also send one batch per step).

    calls = Multiplexer(run, draining); async for response in calls.serve(requests): yield response

`run(request, flow)` is GenerateWhole's body (the same checks, errors and outputs). A call whose client
acknowledges what its reader takes (`acknowledge_every`, then `read` messages) gets a Flow the engine counts those
reads on (engine/flow.py): the engine sends it at most --max-unread-tokens ahead of its reader, since the calls of
one stream share its HTTP/2 window, which cannot hold one of them back. Each call runs as a task that puts its
outputs and its end into the pending list; the engine hands a step's outputs to every listener in one event-loop
callback (engine/outbox.py), so all of a step's tasks run before the writer wakes and takes them as one message.
A cancel aborts a call (its end says CANCELLED); the client half-closing lets the running calls finish, then the
stream ends; a draining server refuses new calls (UNAVAILABLE) and ends the stream once its calls are done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import grpc

from engine.flow import Flow
from splice.call_guard import RpcMetrics
from splice.errors import InvalidArgument, Unavailable
from splice.grpc_errors import status_of
from splice.v1 import engine_pb2

log = logging.getLogger(__name__)

Run = Callable[[engine_pb2.GenerateRequest, Flow | None], AsyncIterator[engine_pb2.GenerateResponse]]
MAX_RESPONSE_BYTES = 1 << 20  # a response is cut before it passes this (gRPC's default receive limit is 4 MiB)
ITEM_BYTES = 24  # a MultiplexItem's own fields, beside its output's
VALUE_BYTES = 6  # one token ID or logprob (a varint or a float, in a packed field)


def _size(item: engine_pb2.MultiplexItem) -> int:
    """An upper estimate of `item`'s encoded size, cheap for the usual output (a few tokens)."""
    out = item.output
    if out.HasField("prompt_logprobs"):
        return item.ByteSize()
    return ITEM_BYTES + len(item.message) + VALUE_BYTES * (len(out.token_ids) + len(out.logprobs)
                                                            + len(out.top_token_ids) + len(out.top_logprobs))


def batches(items: list[engine_pb2.MultiplexItem]) -> list[list[engine_pb2.MultiplexItem]]:
    """`items` in order, cut so that no response passes MAX_RESPONSE_BYTES (an item larger alone goes alone)."""
    out: list[list[engine_pb2.MultiplexItem]] = [[]]
    size = 0
    for item in items:
        n = _size(item)
        if out[-1] and size + n > MAX_RESPONSE_BYTES:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out


class Multiplexer:
    """The calls of one Multiplex stream. `draining()`: the server is shutting down (new calls are refused);
    `wake()` is called by the server when it starts to drain."""

    def __init__(self, run: Run, draining: Callable[[], bool] = lambda: False,
                 metrics: RpcMetrics | None = None) -> None:
        self._run = run
        self._metrics = metrics  # each call counted as one Multiplex request, with its own status
        self._draining = draining
        self._calls: dict[int, asyncio.Task] = {}
        self._flows: dict[int, Flow] = {}  # the calls whose client acknowledges what its reader takes
        self._pending: list[engine_pb2.MultiplexItem] = []
        self._ready = asyncio.Event()
        self._closed = False  # the client half-closed: no more calls

    def wake(self) -> None:
        self._ready.set()

    def _put(self, item: engine_pb2.MultiplexItem) -> None:
        self._pending.append(item)
        self._ready.set()

    def _end(self, call_id: int, code: str, message: str = "", start: float | None = None) -> None:
        if self._metrics is not None and start is not None:
            self._metrics.finish(grpc.StatusCode[code], time.perf_counter() - start)
        self._put(engine_pb2.MultiplexItem(call_id=call_id, end=True, code=code, message=message))

    async def _call(self, call_id: int, request: engine_pb2.GenerateRequest, flow: Flow | None) -> None:
        start = time.perf_counter()
        if self._metrics is not None:
            self._metrics.start()
        try:
            async with aclosing(self._run(request, flow)) as outputs:
                async for pb in outputs:
                    item = engine_pb2.MultiplexItem(call_id=call_id)
                    item.output.CopyFrom(pb)
                    self._put(item)
        except asyncio.CancelledError:
            if self._calls.pop(call_id, None) is not None:  # a cancel message, not the stream going away
                self._end(call_id, "CANCELLED", "the call was cancelled by the client", start)
            elif self._metrics is not None:  # (the stream went away: nobody hears the end, the metrics do)
                self._metrics.finish(grpc.StatusCode.CANCELLED, time.perf_counter() - start)
            raise
        except Exception as exc:
            code, message = status_of(exc)
            if code.name == "INTERNAL":
                log.error("Multiplex call %d failed", call_id, exc_info=exc)
            self._calls.pop(call_id, None)
            self._end(call_id, code.name, message, start)
        else:
            self._calls.pop(call_id, None)
            self._end(call_id, "OK", "", start)
        finally:
            self._flows.pop(call_id, None)

    def _take(self, request: engine_pb2.MultiplexRequest) -> None:
        call_id = request.call_id
        action = request.WhichOneof("action")
        if action == "read":
            flow = self._flows.get(call_id)
            if flow is not None:  # (a call that already ended, or one that does not acknowledge: nothing to count)
                flow.add_read(request.read)
        elif action == "cancel":
            task = self._calls.get(call_id)
            if task is not None:  # (a call that already ended: its end is on its way)
                task.cancel()
        elif action == "start":
            if call_id in self._calls:
                raise InvalidArgument(f"Multiplex call ID {call_id} is already in flight on this stream")
            if self._draining():
                error = Unavailable("the server is shutting down; retry on another replica or after it restarts")
                self._end(call_id, error.code, error.message)
                return
            flow = None
            if request.acknowledge_every:
                flow = self._flows[call_id] = Flow(auto=False, floor=2 * request.acknowledge_every)
            self._calls[call_id] = asyncio.ensure_future(self._call(call_id, request.start, flow))
        else:
            raise InvalidArgument(f"Multiplex message for call {call_id} has neither start nor cancel")

    async def _read(self, requests: AsyncIterator[engine_pb2.MultiplexRequest]) -> None:
        try:
            async for request in requests:
                self._take(request)
        finally:
            self._closed = True
            self._ready.set()

    def _finished(self) -> bool:
        return not self._calls and not self._pending and (self._closed or self._draining())

    async def serve(self, requests: AsyncIterator[engine_pb2.MultiplexRequest],
                    ) -> AsyncIterator[engine_pb2.MultiplexResponse]:
        """The responses, until the client half-closed (or the server drains) and every call ended. A bad
        message fails the whole stream (INVALID_ARGUMENT), which cancels its calls."""
        reader = asyncio.ensure_future(self._read(requests))
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                if reader.done() and reader.exception() is not None:
                    raise reader.exception()
                items, self._pending = self._pending, []
                if items:
                    for batch in batches(items):
                        yield engine_pb2.MultiplexResponse(items=batch)
                if self._finished():
                    return
        finally:
            reader.cancel()
            calls, self._calls = list(self._calls.values()), {}
            for task in calls:
                task.cancel()
