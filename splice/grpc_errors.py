"""Server interceptor: SpliceError -> its gRPC status code; anything else -> INTERNAL, logged.

Servicers stay thin: they raise the core's errors and never call context.abort themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc

from splice.errors import SpliceError
from splice.grpc_wrap import rewrap

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
