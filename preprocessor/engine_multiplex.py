"""The preprocessor's end of a Multiplex stream: many GenerateWhole calls to one engine on one gRPC stream.

    calls = MultiplexedCalls(stub, metadata, error)
    async for pbs in calls.generate(whole): ...     # lists of GenerateResponse, as GenerateWhole's stream gives them

The engine sends one message per step carrying every call's outputs (engine/multiplex.py), instead of one message
per call per step. One reader task hands each call its items; a call's consumer wakes once per message, as before.
Closing a call's generator early (its caller went away, a stop string matched) sends a cancel, which aborts its
sequence. What a call's consumer takes is acknowledged (`read`, every ACK_EVERY tokens): the engine sends a call at
most its --max-unread-tokens ahead of that, so a caller that stops reading (an HTTP client that reads nothing) holds
a bounded inbox here, and its sequences pause on the engine (engine/flow.py). When the stream fails (the engine
went away), every call on it fails with the stream's status and the next call opens a new stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable

import grpc

from splice.errors import SpliceError
from splice.v1 import engine_pb2, engine_pb2_grpc

ErrorOf = Callable[[str, str], SpliceError]  # (status code name, details) -> what the caller raises
# A call's consumer acknowledges what it took once this many tokens have gathered: one message upstream per this many
# tokens, not per output (the engine lets a call run at least twice this ahead, so it never waits for a short one)
ACK_EVERY = 64


class _Inbox:
    """One call's items as they arrive, and the stream's error if it failed first."""

    __slots__ = ("error", "items", "waiter")

    def __init__(self) -> None:
        self.items: list[engine_pb2.MultiplexItem] = []
        self.error: SpliceError | None = None
        self.waiter: asyncio.Future | None = None

    def put(self, item: engine_pb2.MultiplexItem) -> None:
        self.items.append(item)
        self._wake()

    def fail(self, error: SpliceError) -> None:
        self.error = error
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def take(self) -> list[engine_pb2.MultiplexItem]:
        while not self.items:
            if self.error is not None:
                raise self.error
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        items, self.items = self.items, []
        return items


class _Stream:
    """One Multiplex call: its outgoing queue, and the reader that routes items to inboxes."""

    def __init__(self, stub: engine_pb2_grpc.EngineStub, metadata: tuple, error_of: ErrorOf) -> None:
        self._outgoing: asyncio.Queue[engine_pb2.MultiplexRequest | None] = asyncio.Queue()
        self._error_of = error_of
        self.inboxes: dict[int, _Inbox] = {}
        self.failed = False
        self._call = stub.Multiplex(self._requests(), metadata=metadata)
        self._reader = asyncio.ensure_future(self._read())

    async def _requests(self) -> AsyncIterator[engine_pb2.MultiplexRequest]:
        while (request := await self._outgoing.get()) is not None:
            yield request

    def send(self, request: engine_pb2.MultiplexRequest) -> None:
        self._outgoing.put_nowait(request)

    async def _read(self) -> None:
        try:
            async for response in self._call:
                for item in response.items:
                    inbox = self.inboxes.get(item.call_id)
                    if inbox is not None:  # (a call whose caller left: its cancel is on its way)
                        inbox.put(item)
            error = self._error_of("UNAVAILABLE", "the engine ended its Multiplex stream")
        except grpc.aio.AioRpcError as exc:
            error = self._error_of(exc.code().name, exc.details() or "")
        except asyncio.CancelledError:
            error = self._error_of("UNAVAILABLE", "the preprocessor closed its Multiplex stream")
        self.failed = True
        for inbox in self.inboxes.values():
            inbox.fail(error)

    async def close(self) -> None:
        self.failed = True
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class MultiplexedCalls:
    """Calls to one engine over one Multiplex stream, opened at the first call and again after a failure."""

    def __init__(self, stub: engine_pb2_grpc.EngineStub, metadata: tuple, error_of: ErrorOf) -> None:
        self._stub = stub
        self._metadata = metadata
        self._error_of = error_of
        self._stream: _Stream | None = None
        self._ids = itertools.count(1)

    def _open(self) -> _Stream:
        if self._stream is None or self._stream.failed:
            self._stream = _Stream(self._stub, self._metadata, self._error_of)
        return self._stream

    async def generate(self, whole: engine_pb2.GenerateRequest,
                       ) -> AsyncIterator[list[engine_pb2.GenerateResponse]]:
        """The call's outputs, in lists: what arrived for it since its reader last took (a reader that fell behind
        takes several steps' at once); raises its error (the engine's status for it, or the stream's)."""
        stream = self._open()
        call_id = next(self._ids)
        inbox = stream.inboxes[call_id] = _Inbox()
        stream.send(engine_pb2.MultiplexRequest(call_id=call_id, start=whole, acknowledge_every=ACK_EVERY))
        ended = False
        taken = 0  # tokens taken and not yet acknowledged
        try:
            while True:
                items = await inbox.take()
                last = items[-1]
                if last.end:
                    ended = True
                    items.pop()
                taken += sum(len(item.output.token_ids) for item in items)
                if taken >= ACK_EVERY and not ended and not stream.failed:
                    stream.send(engine_pb2.MultiplexRequest(call_id=call_id, read=taken))
                    taken = 0
                if items:
                    yield [item.output for item in items]
                if ended:
                    if last.code != "OK":
                        raise self._error_of(last.code, last.message)
                    return
        finally:
            del stream.inboxes[call_id]
            if not ended and not stream.failed:
                stream.send(engine_pb2.MultiplexRequest(call_id=call_id, cancel=True))

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.close()
