"""Server interceptor: SpliceError -> its gRPC status code; anything else -> INTERNAL, logged.

Servicers stay thin: they raise the core's errors and never call context.abort themselves.
"""

from __future__ import annotations

import logging

import grpc

from splice.errors import SpliceError
from splice.grpc_wrap import SpliceInterceptor, rewrap

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


class ErrorInterceptor(SpliceInterceptor):
    """Every exception of a splice.v1 handler becomes its status code."""

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        def unary(inner):
            async def wrapper(request, context):
                try:
                    return await inner(request, context)
                except Exception as exc:
                    await _abort(context, method, exc)

            return wrapper

        def streaming(inner):
            async def wrapper(request, context):
                try:
                    async for item in inner(request, context):
                        yield item
                except Exception as exc:
                    await _abort(context, method, exc)

            return wrapper

        return rewrap(handler, unary, streaming)
