"""The HTTP face's connection guards: connections that send their headers a byte at a time (slowloris) are closed
once the header time limit passes, while normal requests are served; connections past the limit are answered 503
and closed at once, and the face serves again once they are gone; each connection's kernel send buffer is bounded."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from preprocessor.http.options import HttpOptions
from tests.preprocessor.http_face import http_face

SLOW = 100
HEADER_TIMEOUT = 2.0
GUARD = 60.0  # seconds: a failure guard, not a timing assertion


async def _trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
    """Sends a request's headers one byte every 0.5 s until the server closes the connection (EOF, or a write
    that fails); returns when that was observed."""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    for byte in head:
        try:
            writer.write(bytes([byte]))
            await writer.drain()
            if await asyncio.wait_for(reader.read(1), 0.5) == b"":
                break  # EOF: closed by the server
        except TimeoutError:
            continue  # nothing to read yet: the next byte
        except ConnectionError:
            break
    writer.close()
    return time.monotonic()


async def test_slowloris_connections_are_closed_while_others_are_served(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, http=HttpOptions(port=0, header_timeout=HEADER_TIMEOUT)) as face:
        sockets = [await asyncio.open_connection(*face.http_address) for _ in range(SLOW)]
        began = time.monotonic()
        slow = [asyncio.create_task(_trickle(r, w)) for r, w in sockets]
        served = await face.http.post("/tokenize", json={"prompt": "hello"})
        assert served.status_code == 200
        closed = await asyncio.wait_for(asyncio.gather(*slow), GUARD)  # each one saw EOF
        print(f"{SLOW} slowloris sockets closed {max(closed) - began:.1f} s after they opened "
              f"(header timeout {HEADER_TIMEOUT:g} s)")
        assert (await face.http.post("/tokenize", json={"prompt": "hello"})).status_code == 200


async def test_connections_past_the_limit_are_refused_at_once(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, http=HttpOptions(port=0, header_timeout=HEADER_TIMEOUT,
                                                           max_connections=4)) as face:
        idle = [await asyncio.open_connection(*face.http_address) for _ in range(4)]
        reader, writer = await asyncio.open_connection(*face.http_address)
        refused = await asyncio.wait_for(reader.read(), GUARD)  # answered and closed without a request
        assert refused.startswith(b"HTTP/1.1 503") and b"--http-max-connections" in refused, refused
        writer.close()
        for r, w in idle:  # the idle ones are closed by the header time limit
            assert await asyncio.wait_for(r.read(), GUARD) == b""
            w.close()
        deadline = time.monotonic() + GUARD
        while face.pre._http.open_connections:  # (the server notes a close a loop turn after the client sees it)
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert (await face.http.post("/tokenize", json={"prompt": "hello"})).status_code == 200


async def _send_buffers(face, connections: int) -> list[int]:
    """SO_SNDBUF of the server's side of each open HTTP connection, once `connections` are open."""
    deadline = time.monotonic() + GUARD
    while face.pre._http.open_connections < connections:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    return [p.transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            for p in face.pre._http._server.server_state.connections]


async def test_what_the_kernel_buffers_for_a_connection_is_bounded(tiny_dirs, tiny):
    """A client that does not read holds what its connection's send buffer takes; Linux starts and grows that buffer
    up to tcp_wmem's maximum (4 MiB on loopback here), unless the socket's size is set, as the face does
    (--http-send-buffer-kb)."""
    kb = 64
    async with http_face(tiny_dirs, tiny, http=HttpOptions(port=0, send_buffer_kb=kb)) as face:
        _, writer = await asyncio.open_connection(*face.http_address)
        sizes = await _send_buffers(face, 1)
        assert all(kb << 10 <= size <= 2 * kb << 10 for size in sizes), sizes  # (Linux doubles what it is given)
        writer.close()


def test_a_negative_send_buffer_is_refused():
    with pytest.raises(ValueError, match="--http-send-buffer-kb"):
        HttpOptions(send_buffer_kb=-1)
