"""Everything a splice.v1 call goes through on a server, in ONE wrapper per method built once at start-up:
metrics, errors -> status codes, the bearer token, admission (preprocessor) and drain.

In this order, outermost first:

    metrics -> errors -> token -> admission -> parse -> drain -> servicer

Why not grpc.aio interceptors: each one costs, per call, a coroutine in gRPC's interceptor chain, a rebuilt
method handler and one more async-generator layer every streamed message passes through; four of them were a
measurable part of the time to first token. Here the handlers are wrapped once, at registration (`register`),
so a call pays for one coroutine layer and nothing else; health is registered untouched, reflection too unless the
server asks for it to be guarded (`also`).

A unary request reaches the wrapper as raw bytes (its deserializer is removed) and is parsed only once the call
was authorized and admitted: a refused message is never parsed, as before. A client stream's messages are
parsed one by one as the servicer reads them, after the same checks; a client stream refused before its end
is read to its end (bounded, unparsed) before the refusal is sent, so grpc.aio clients see it (`_drop_rest`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Protocol

import grpc

from splice.drain import Drain
from splice.errors import DeadlineExceeded, Unauthenticated
from splice.grpc_errors import Malformed, abort_with, refusal, tolerant
from splice.metrics.rpc import RPC_SECONDS, RPCS, RPCS_IN_FLIGHT

PREFIX = "/splice.v1."
REFUSED_STREAM_GAP = 1.0  # seconds a refused client stream may stay quiet while it is read to its end
REFUSED_STREAM_SECONDS = 10.0  # seconds it may take in all
UNAUTHENTICATED = "missing or wrong API key: send 'authorization: Bearer KEY' metadata"


class Ticket(Protocol):
    def release(self) -> None: ...


class Admission(Protocol):
    """preprocessor.admission.Admission: a place and `nbytes` for one request, or ResourceExhausted."""

    def enter(self, nbytes: int) -> Ticket: ...


def status_code(context: grpc.aio.ServicerContext, exc: BaseException | None) -> grpc.StatusCode:
    """The status a handler that ended with `exc` (None: returned normally) sends to the client."""
    if exc is None or isinstance(exc, grpc.aio.AbortError):
        # context.abort() and context.set_code() both leave the code on the context
        return context.code() or grpc.StatusCode.OK
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        # grpc.aio cancels the handler when the client cancels or the deadline passes
        remaining = context.time_remaining()
        return grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0 else \
            grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN  # what grpc.aio answers for an exception nobody mapped


class RpcMetrics:
    """One method's metric children, looked up on its first call and kept (prometheus' labels() takes a lock
    and builds a key tuple on every lookup)."""

    def __init__(self, full_method: str) -> None:
        self.service, _, self.method = full_method.lstrip("/").partition("/")  # "/splice.v1.Engine/Generate"
        self._in_flight = self._seconds = None
        self._codes: dict[grpc.StatusCode, object] = {}

    def start(self) -> None:
        if self._in_flight is None:
            self._in_flight = RPCS_IN_FLIGHT.labels(self.service, self.method)
            self._seconds = RPC_SECONDS.labels(self.service, self.method)
        self._in_flight.inc()

    def done(self, context: grpc.aio.ServicerContext, exc: BaseException | None, seconds: float) -> None:
        self.finish(status_code(context, exc), seconds)

    def finish(self, code: grpc.StatusCode, seconds: float) -> None:
        """A call that `start`ed ended with `code` after `seconds`."""
        self._in_flight.dec()
        self._seconds.observe(seconds)
        counter = self._codes.get(code)
        if counter is None:
            counter = self._codes[code] = RPCS.labels(self.service, self.method, code.name)
        counter.inc()


class _Uncounted:
    """The metrics of a stream that carries calls counted one by one (Engine/Multiplex): none of its own."""

    def start(self) -> None:
        pass

    def done(self, context: grpc.aio.ServicerContext, exc: BaseException | None, seconds: float) -> None:
        pass


class CallGuard:
    """`api_key`: calls without `authorization: Bearer KEY` get UNAUTHENTICATED; `admission`: unary-request calls
    are admitted by their raw message size (client streams admit themselves in their servicer); `drain`: refuses
    new calls while the server drains and counts the running ones."""

    def __init__(self, drain: Drain, api_key: str | None = None, admission: Admission | None = None,
                 also: tuple[str, ...] = (), uncounted: tuple[str, ...] = ()) -> None:
        """`also`: method prefixes guarded besides splice.v1's, e.g. reflection's when the key covers it;
        `uncounted`: methods whose streams carry calls that their servicer counts (RpcMetrics) one by one."""
        self.drain = drain
        self.admission = admission
        self.prefixes = (PREFIX, *also)
        self.uncounted = uncounted
        self._expected = f"Bearer {api_key}".encode() if api_key else None

    def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        if self._expected is None:
            return
        given = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                given = value  # the last one, as a dict of the metadata would have it
        if not hmac.compare_digest(given.encode() if isinstance(given, str) else given, self._expected):
            raise Unauthenticated(UNAUTHENTICATED)  # a new one each time: a raised exception keeps its traceback

    def register(self, add_to_server: Callable[[object, object], None], servicer: object,
                 server: grpc.aio.Server) -> None:
        """`add_XServicer_to_server(servicer, server)` with every splice.v1 handler wrapped."""
        add_to_server(servicer, _Registrar(server, self))

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """`handler` with the guard's work around it; handlers outside its prefixes are returned as they are."""
        if not method.startswith(self.prefixes):
            return handler
        parse = tolerant(handler.request_deserializer) or (lambda data: data)
        ser = handler.response_serializer
        if handler.request_streaming:
            inner = handler.stream_unary or handler.stream_stream
            prepare = self._stream_prepare(parse, method)
        else:
            inner = handler.unary_unary or handler.unary_stream
            prepare = self._unary_prepare(parse, method)
        if handler.response_streaming:
            wrapper = self._streaming(inner, prepare, method)
            make = grpc.stream_stream_rpc_method_handler if handler.request_streaming else \
                grpc.unary_stream_rpc_method_handler
        else:
            wrapper = self._unary(inner, prepare, method)
            make = grpc.stream_unary_rpc_method_handler if handler.request_streaming else \
                grpc.unary_unary_rpc_method_handler
        return make(wrapper, None, ser)  # no deserializer: `prepare` parses once the call is let in

    def _metrics(self, method: str) -> RpcMetrics | _Uncounted:
        return _Uncounted() if method in self.uncounted else RpcMetrics(method)

    def _unary_prepare(self, parse: Callable[[bytes], object], method: str):
        admission = self.admission

        def prepare(raw: bytes, context: grpc.aio.ServicerContext, call: _Call) -> object:
            self._authorize(context)
            if admission is not None:
                call.tickets.append(admission.enter(len(raw)))  # before parsing: a refused message is never parsed
            request = parse(raw)
            if isinstance(request, Malformed):
                raise refusal(method, request)
            return request

        return prepare

    def _stream_prepare(self, parse: Callable[[bytes], object], method: str):
        def prepare(raw: AsyncIterator[bytes], context: grpc.aio.ServicerContext, call: _Call) -> object:
            call.unread = raw  # from here on, a refusal reads the rest of the stream before it is sent
            self._authorize(context)
            return _parsed_stream(raw, parse, method)

        return prepare

    def _unary(self, inner, prepare, method: str):
        drain, metrics = self.drain, self._metrics(method)

        async def wrapper(raw, context):
            async with _Call(drain, metrics, method, context) as call:
                request = prepare(raw, context, call)
                call.enter()
                return await inner(request, context)

        return wrapper

    def _streaming(self, inner, prepare, method: str):
        drain, metrics = self.drain, self._metrics(method)

        async def wrapper(raw, context):
            async with _Call(drain, metrics, method, context) as call:
                request = prepare(raw, context, call)
                call.enter()
                async for item in inner(request, context):
                    yield item

        return wrapper


class _Call:
    """One guarded call around its preparation and its servicer: counted in the metrics from its start, in the
    drain once let in (`enter`), holding its admission tickets until it ends; an Exception becomes its status code
    (`abort_with`), after the rest of a refused client stream was read (`_drop_rest`), and the metrics record the
    status the client gets. A class, not @asynccontextmanager: one object and two plain method calls per call."""

    __slots__ = ("context", "drain", "entered", "method", "metrics", "start", "tickets", "unread")

    def __init__(self, drain: Drain, metrics: RpcMetrics | _Uncounted, method: str,
                 context: grpc.aio.ServicerContext) -> None:
        self.drain, self.metrics, self.method, self.context = drain, metrics, method, context
        self.tickets: list[Ticket] = []
        self.entered = False
        self.start = 0.0
        self.unread: AsyncIterator[bytes] | None = None  # a client stream's raw messages

    async def __aenter__(self) -> _Call:
        self.metrics.start()
        self.start = _now()
        return self

    def enter(self) -> None:
        self.drain.enter()
        self.entered = True

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if self.entered:
            self.drain.leave()
        for ticket in self.tickets:
            ticket.release()
        final = exc
        try:
            if isinstance(exc, Exception):
                if self.unread is not None and not isinstance(exc, DeadlineExceeded):  # (a silent stream)
                    await _drop_rest(self.unread)
                await abort_with(self.context, self.method, exc)  # raises the status the client gets
        except BaseException as aborted:
            final = aborted
            raise
        finally:
            # (a cancellation or a closed stream is not an Exception: it propagates as it is, nothing awaited)
            self.metrics.done(self.context, final, _now() - self.start)
        return False


async def _parsed_stream(raw: AsyncIterator[bytes], parse: Callable[[bytes], object],
                         method: str) -> AsyncIterator[object]:
    """A client stream's messages, parsed as they are read; INVALID_ARGUMENT at the first that does not parse."""
    async for data in raw:
        request = parse(data)
        if isinstance(request, Malformed):
            raise refusal(method, request)
        yield request


async def _drop_rest(raw: AsyncIterator[bytes]) -> None:
    """Reads and drops, unparsed, what a refused client stream still sends: until it half-closes, goes quiet for
    REFUSED_STREAM_GAP seconds, or REFUSED_STREAM_SECONDS pass.

    Why: a grpc.aio client whose write fails because the server already ended the call reports INTERNAL
    ("Failed execute_batch", grpc/grpc#36066) in place of the status the server sent, about one time in two when
    the server refuses a stream before it was read to its end (a wrong key, a declared size over the cap, a
    malformed part). Reading to the half-close first lets every client see the real refusal. Bounded, so a
    refused caller cannot hold the server for long."""
    loop = asyncio.get_running_loop()
    end = loop.time() + REFUSED_STREAM_SECONDS
    messages = aiter(raw)
    with contextlib.suppress(Exception):  # TimeoutError, or the stream already failed or was cancelled
        while (left := end - loop.time()) > 0:
            if await asyncio.wait_for(anext(messages, None), min(REFUSED_STREAM_GAP, left)) is None:
                return


def _now() -> float:
    return time.perf_counter()


class _Guarded(grpc.GenericRpcHandler):
    """A generic handler whose splice.v1 method handlers are wrapped, each once."""

    def __init__(self, inner: grpc.GenericRpcHandler, guard: CallGuard) -> None:
        self._inner, self._guard = inner, guard
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        wrapped = self._wrapped.get(details.method)
        if wrapped is None:
            handler = self._inner.service(details)
            if handler is None:
                return None
            wrapped = self._wrapped[details.method] = self._guard.wrap(handler, details.method)
        return wrapped


class _Registrar:
    """What generated `add_XServicer_to_server` functions see as the server: they register wrapped handlers."""

    def __init__(self, server: grpc.aio.Server, guard: CallGuard) -> None:
        self._server, self._guard = server, guard

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_Guarded(h, self._guard) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(
            service, {name: self._guard.wrap(h, f"/{service}/{name}") for name, h in handlers.items()})
