"""Rebuilds an RPC method handler around its behaviour, whatever its shape (for server interceptors).

Unary-response shapes (unary_unary, stream_unary) take `unary(inner)`; streaming-response shapes take
`streaming(inner)`. Each returns an async function (or async generator function) of (request, context).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc

Wrap = Callable[[Callable], Callable]


def rewrap(handler: grpc.RpcMethodHandler, unary: Wrap, streaming: Wrap,
           deserializer: Callable[[bytes], object] | None = None) -> grpc.RpcMethodHandler:
    """`deserializer` replaces the handler's request deserializer when given."""
    de, ser = deserializer or handler.request_deserializer, handler.response_serializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), de, ser)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), de, ser)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), de, ser)
    return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), de, ser)


class SpliceInterceptor(grpc.aio.ServerInterceptor):
    """Base of the servers' interceptors: `wrap` sees only the handlers of services under `prefix`
    (health and reflection pass untouched)."""

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
        return self.wrap(handler, details.method)

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        raise NotImplementedError
