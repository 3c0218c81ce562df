"""A busy port is an error: two servers must never silently share one address."""

from __future__ import annotations

import grpc
import pytest

from splice.errors import FailedPrecondition
from splice.grpc_options import SERVER_OPTIONS, bind


async def test_second_server_on_a_busy_port_fails_to_bind():
    first = grpc.aio.server(options=SERVER_OPTIONS)
    port = bind(first, "127.0.0.1", 0)
    await first.start()
    try:
        with pytest.raises(FailedPrecondition, match=f"127.0.0.1:{port}"):
            bind(grpc.aio.server(options=SERVER_OPTIONS), "127.0.0.1", port)
    finally:
        await first.stop(0)
    # once the first is gone the port is free again (restarts reuse their port)
    assert bind(grpc.aio.server(options=SERVER_OPTIONS), "127.0.0.1", port) == port
