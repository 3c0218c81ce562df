"""MetricsInterceptor in front of ErrorInterceptor records the status code the client actually receives."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import REGISTRY

from splice.errors import InvalidArgument
from splice.grpc_errors import ErrorInterceptor
from splice.metrics_interceptor import MetricsInterceptor, status_code

SERVICE = "splice.v1.MetricsTest"


async def _ok(request: bytes, context) -> bytes:
    return request


async def _invalid(request: bytes, context) -> bytes:
    raise InvalidArgument("bad request")


async def _bug(request: bytes, context) -> bytes:
    raise ValueError("a bug")


async def _aborts(request: bytes, context) -> bytes:
    await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")


async def _stream_then_invalid(request: bytes, context):
    yield b"a"
    yield b"b"
    raise InvalidArgument("bad in the middle")


async def _stream_forever(request: bytes, context):
    while True:
        yield b"x"
        await asyncio.sleep(0.01)


HANDLERS = {
    "Ok": grpc.unary_unary_rpc_method_handler(_ok),
    "Invalid": grpc.unary_unary_rpc_method_handler(_invalid),
    "Bug": grpc.unary_unary_rpc_method_handler(_bug),
    "Aborts": grpc.unary_unary_rpc_method_handler(_aborts),
    "StreamThenInvalid": grpc.unary_stream_rpc_method_handler(_stream_then_invalid),
    "StreamForever": grpc.unary_stream_rpc_method_handler(_stream_forever),
}


def _count(method: str, code: str) -> float:
    return REGISTRY.get_sample_value("splice_rpc_requests_total",
                                     {"service": SERVICE, "method": method, "code": code}) or 0.0


def _observed(method: str) -> float:
    return REGISTRY.get_sample_value("splice_rpc_duration_seconds_count", {"service": SERVICE, "method": method}) or 0.0


async def _serve(interceptors: list) -> tuple[grpc.aio.Server, grpc.aio.Channel]:
    server = grpc.aio.server(interceptors=interceptors)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, HANDLERS),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, grpc.aio.insecure_channel(f"127.0.0.1:{port}")


async def _call_code(channel: grpc.aio.Channel, method: str) -> grpc.StatusCode:
    path = f"/{SERVICE}/{method}"
    try:
        if method.startswith("Stream"):
            async for _ in channel.unary_stream(path)(b"hi", timeout=10):
                pass
        else:
            await channel.unary_unary(path)(b"hi", timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _until(predicate, timeout: float = 5.0) -> None:
    """The server records after the client already has the status: wait for it briefly."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "metric never moved"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("method", ["Ok", "Invalid", "Bug", "Aborts", "StreamThenInvalid"])
async def test_recorded_code_is_the_client_code(method):
    server, channel = await _serve([MetricsInterceptor(), ErrorInterceptor()])
    try:
        before = {c.name: _count(method, c.name) for c in grpc.StatusCode}
        observed = _observed(method)
        code = await _call_code(channel, method)
        await _until(lambda: _observed(method) == observed + 1)
        after = {c.name: _count(method, c.name) for c in grpc.StatusCode}
    finally:
        await channel.close()
        await server.stop(0)
    assert code == {"Ok": grpc.StatusCode.OK, "Invalid": grpc.StatusCode.INVALID_ARGUMENT,
                    "Bug": grpc.StatusCode.INTERNAL, "Aborts": grpc.StatusCode.NOT_FOUND,
                    "StreamThenInvalid": grpc.StatusCode.INVALID_ARGUMENT}[method]
    moved = {name: after[name] - before[name] for name in after if after[name] != before[name]}
    assert moved == {code.name: 1.0}


async def test_unmapped_exception_without_error_interceptor_is_unknown():
    server, channel = await _serve([MetricsInterceptor()])
    try:
        before = _count("Bug", "UNKNOWN")
        assert await _call_code(channel, "Bug") == grpc.StatusCode.UNKNOWN
        await _until(lambda: _count("Bug", "UNKNOWN") == before + 1)
    finally:
        await channel.close()
        await server.stop(0)


async def test_client_cancel_is_cancelled_and_leaves_no_call_in_flight():
    server, channel = await _serve([MetricsInterceptor(), ErrorInterceptor()])
    labels = {"service": SERVICE, "method": "StreamForever"}
    try:
        before = _count("StreamForever", "CANCELLED")
        call = channel.unary_stream(f"/{SERVICE}/StreamForever")(b"hi")
        await call.read()
        assert REGISTRY.get_sample_value("splice_rpc_in_flight", labels) == 1.0
        call.cancel()
        await _until(lambda: _count("StreamForever", "CANCELLED") == before + 1)
        assert REGISTRY.get_sample_value("splice_rpc_in_flight", labels) == 0.0
    finally:
        await channel.close()
        await server.stop(0)


async def test_health_and_other_services_are_not_counted():
    server, channel = await _serve([MetricsInterceptor(prefix="/splice.v1.Other/")])
    try:
        before = _count("Ok", "OK")
        assert await _call_code(channel, "Ok") == grpc.StatusCode.OK
    finally:
        await channel.close()
        await server.stop(0)
    assert _count("Ok", "OK") == before


class _Context:
    def __init__(self, code: grpc.StatusCode | None = None, remaining: float | None = None) -> None:
        self._code, self._remaining = code, remaining

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def time_remaining(self) -> float | None:
        return self._remaining


def test_status_mapping():
    assert status_code(_Context(), None) == grpc.StatusCode.OK
    assert status_code(_Context(grpc.StatusCode.NOT_FOUND), None) == grpc.StatusCode.NOT_FOUND  # set_code
    abort = grpc.aio.AbortError()
    assert status_code(_Context(grpc.StatusCode.INVALID_ARGUMENT), abort) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_code(_Context(), asyncio.CancelledError()) == grpc.StatusCode.CANCELLED
    assert status_code(_Context(remaining=5.0), asyncio.CancelledError()) == grpc.StatusCode.CANCELLED
    assert status_code(_Context(remaining=0.0), asyncio.CancelledError()) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert status_code(_Context(), RuntimeError()) == grpc.StatusCode.UNKNOWN
