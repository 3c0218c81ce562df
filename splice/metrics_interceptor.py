"""Server interceptor: counts splice.v1 RPCs by service/method/status code and times them.

Install it before ErrorInterceptor (`interceptors=[MetricsInterceptor(), ErrorInterceptor()]`): the
first interceptor is the outermost wrapper, so it sees the abort ErrorInterceptor turns an exception
into and records the code the client receives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from splice.grpc_wrap import SpliceInterceptor, rewrap
from splice.metrics.rpc import RPC_SECONDS, RPCS, RPCS_IN_FLIGHT


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


class _Call:
    """One RPC's bookkeeping: in-flight while open, then one count and one latency sample."""

    def __init__(self, service: str, method: str) -> None:
        self.service, self.method = service, method
        self.start = time.perf_counter()
        RPCS_IN_FLIGHT.labels(service, method).inc()

    def done(self, context: grpc.aio.ServicerContext, exc: BaseException | None) -> None:
        RPCS_IN_FLIGHT.labels(self.service, self.method).dec()
        RPC_SECONDS.labels(self.service, self.method).observe(time.perf_counter() - self.start)
        RPCS.labels(self.service, self.method, status_code(context, exc).name).inc()


class MetricsInterceptor(SpliceInterceptor):
    """Counts and times every splice.v1 RPC (health and reflection are not counted)."""

    def wrap(self, handler: grpc.RpcMethodHandler, full_method: str) -> grpc.RpcMethodHandler:
        service, _, method = full_method.lstrip("/").partition("/")  # "/splice.v1.Engine/Generate"

        def unary(inner):
            async def wrapper(request, context):
                call = _Call(service, method)
                try:
                    response = await inner(request, context)
                except BaseException as exc:
                    call.done(context, exc)
                    raise
                call.done(context, None)
                return response

            return wrapper

        def streaming(inner):
            async def wrapper(request, context) -> AsyncIterator:
                call = _Call(service, method)
                try:
                    async for item in inner(request, context):
                        yield item
                except BaseException as exc:
                    call.done(context, exc)
                    raise
                call.done(context, None)

            return wrapper

        return rewrap(handler, unary, streaming)
