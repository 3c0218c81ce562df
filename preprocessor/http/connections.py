"""Connection guards uvicorn lacks, on its h11 protocol: a time limit on reading a request's headers, a limit on
open connections, and a bound on what the kernel buffers for a client that does not read.

Why: uvicorn times out only idle kept-alive connections, and any byte resets that timer, so a client that sends
its headers one byte at a time (slowloris) holds a connection, and a file descriptor, forever; enough of them
exhaust the process. Its `limit_concurrency` answers 503 to requests beyond a count but never closes the
connections that fill it, and counts connections that never sent a request.

Here a connection must deliver a request's complete headers within `header_timeout` seconds of opening (or, kept
alive, of the first byte of its next request), else it is closed; a connection opened while `max_connections`
are open is answered 503 and closed at once, before it can hold anything.

`send_buffer` fixes each connection's kernel send buffer (SO_SNDBUF), which Linux otherwise grows up to
net.ipv4.tcp_wmem's maximum (4 MiB here) while the client does not read. A stream is held back only once that buffer
is full (uvicorn then waits, the preprocessor stops pulling, the engine pauses the request: engine/flow.py), so
everything the buffer takes is generated and rendered for nobody: 8 clients that never read, n 16 with 20 logprobs
a token, cost 17,268 generated tokens and 4.3 CPU seconds of the two services per round with the kernel's tuning,
~4,600-4,750 tokens and 1.0-1.1 s with 256 KiB (bench/hostile_soak.py's silent readers). Linux doubles what is set
and caps it at net.core.wmem_max. 256 KiB still streams at hundreds of MB/s on a local network; over a link of
100 ms round trip a whole answer comes at ~4-5 MB/s (0 restores the kernel's).
"""

from __future__ import annotations

import asyncio
import json
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def _busy_response(max_connections: int) -> bytes:
    body = json.dumps({"error": {"message": f"the HTTP face has {max_connections} connections open, its limit "
                                            f"(--http-max-connections); retry later", "type": "server_error",
                                 "param": None, "code": "UNAVAILABLE"}}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(body)) + body


class GuardedH11(H11Protocol):
    header_timeout: float = 10.0  # seconds to deliver a request's headers
    max_connections: int = 1024  # open at once
    send_buffer: int = 0  # bytes: the socket's SO_SNDBUF; 0: the kernel's autotuning

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if self.send_buffer and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        if len(self.connections) > self.max_connections:
            transport.write(_busy_response(self.max_connections))
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        if self._header_timer is not None and self.conn.their_state is not h11.IDLE:
            self._header_timer.cancel()  # the headers are complete: the request is the app's now
            self._header_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def guarded_h11(header_timeout: float, max_connections: int, send_buffer: int = 0) -> type[GuardedH11]:
    """The protocol class for uvicorn.Config(http=...), with these limits."""
    return type("GuardedH11", (GuardedH11,), {"header_timeout": header_timeout, "max_connections": max_connections,
                                              "send_buffer": send_buffer})
