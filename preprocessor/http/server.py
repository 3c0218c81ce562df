"""uvicorn serving the HTTP face on the running event loop (the gRPC server's): a task, not a thread.

The socket is bound here, so port 0 yields its real port and a busy port is a one-line start-up error.
uvicorn's own signal handling is off: the preprocessor's entry point owns SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl

import anyio
import uvicorn
from fastapi import FastAPI

from preprocessor.http.connections import guarded_h11
from splice.errors import FailedPrecondition
from splice.security import ServerTLS


class _OnThisLoop(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _listen(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        # proto must be IPPROTO_TCP (socket.create_server leaves it 0): asyncio then sets TCP_NODELAY on each
        # connection. Without it, a response's header and body writes wait out the client's delayed ACK (40 ms).
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise FailedPrecondition(f"cannot listen on {host}:{port} (HTTP): {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise FailedPrecondition(f"cannot listen on {host}:{port} (HTTP): {exc.strerror or exc}") from None
    return sock


async def _prepare(app: FastAPI) -> None:
    """Builds what Starlette, FastAPI and anyio otherwise build during the first request (~20 ms on two CPUs: the
    middleware stack, each included router's table of routes with their parameters' validators, anyio's asyncio
    backend that a streamed answer's task group imports), so the first request costs what the next ones do. The
    routers are built by routing a path no route has, past the middlewares (no key, admission or metric sees it)."""
    anyio.get_cancelled_exc_class()  # (imports the running backend)
    app.middleware_stack = app.build_middleware_stack()  # (what Starlette's __call__ builds when it finds None)
    path = "/_splice_prepare"
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [], "http_version": "1.1", "scheme": "http", "server": None, "client": None, "root_path": ""}

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        pass

    await app.router(scope, receive, send)  # (a 404, sent to nobody)


class HttpServer:
    def __init__(self, app: FastAPI, host: str, port: int, grace: float = 5.0, tls: ServerTLS | None = None,
                 header_timeout: float = 10.0, max_connections: int = 1024, send_buffer: int = 0) -> None:
        """`tls`: HTTPS with the gRPC face's certificate (client certificates required when it has a CA).
        `header_timeout`, `max_connections`, `send_buffer`: the connection guards (connections.py)."""
        self.host, self.port = host, port
        self.protocol = guarded_h11(header_timeout, max_connections, send_buffer)
        self.grace = grace
        self.tls = tls
        self._app = app
        self._server: _OnThisLoop | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> int:
        """Binds and serves; returns the bound port."""
        sock = _listen(self.host, self.port)
        self.port = sock.getsockname()[1]
        ssl_args = {}
        if self.tls is not None:
            ssl_args = {"ssl_certfile": str(self.tls.cert), "ssl_keyfile": str(self.tls.key)}
            if self.tls.ca is not None:
                ssl_args |= {"ssl_ca_certs": str(self.tls.ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        config = uvicorn.Config(self._app, lifespan="off", access_log=False, log_config=None, log_level="warning",
                                http=self.protocol, timeout_keep_alive=30, timeout_graceful_shutdown=self.grace,
                                **ssl_args)
        await _prepare(self._app)
        self._server = _OnThisLoop(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http-server")
        while not self._server.started:
            if self._task.done():  # startup failed: surface its error
                await self._task
                raise FailedPrecondition(f"the HTTP server on {self.host}:{self.port} did not start")
            await asyncio.sleep(0.01)
        return self.port

    @property
    def open_connections(self) -> int:
        return len(self._server.server_state.connections) if self._server is not None else 0

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await self._task
