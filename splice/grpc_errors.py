"""Server interceptor: SpliceError -> its gRPC status code; anything else -> INTERNAL, logged.

Servicers stay thin: they raise the core's errors and never call context.abort themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc

from splice.errors import SpliceError

log = logging.getLogger(__name__)


def _status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, SpliceError):
        return grpc.StatusCode[exc.code], exc.message
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


async def _abort(context: grpc.aio.ServicerContext, method: str, exc: Exception) -> None:
    if isinstance(exc, grpc.aio.AbortError):  # the handler aborted with its own status already
        raise exc
    code, message = _status(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    await context.abort(code, message)


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Wraps the handlers of services under `prefix` (health and reflection are left alone)."""

    def __init__(self, prefix: str = "/splice.v1.") -> None:
        self._prefix = prefix

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self._prefix):
            return handler
        method = details.method
        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary_unary(request, context):
                try:
                    return await inner(request, context)
                except Exception as exc:
                    await _abort(context, method, exc)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream:
            inner_us = handler.unary_stream

            async def unary_stream(request, context):
                try:
                    async for item in inner_us(request, context):
                        yield item
                except Exception as exc:
                    await _abort(context, method, exc)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, handler.request_deserializer, handler.response_serializer)
        if handler.stream_unary:
            inner_su = handler.stream_unary

            async def stream_unary(request_iterator, context):
                try:
                    return await inner_su(request_iterator, context)
                except Exception as exc:
                    await _abort(context, method, exc)

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, handler.request_deserializer, handler.response_serializer)
        inner_ss = handler.stream_stream

        async def stream_stream(request_iterator, context):
            try:
                async for item in inner_ss(request_iterator, context):
                    yield item
            except Exception as exc:
                await _abort(context, method, exc)

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, handler.request_deserializer, handler.response_serializer)
