"""grpc.aio server of splice.v1.Preprocessor: wiring only (call guard, servicer, health, reflection),
and beside it, on the same event loop and the same engine link, the OpenAI-compatible HTTP face (http/).

The engine connection is engine_link.py's: health follows the link's readiness (NOT_SERVING until the
engine's ModelInfo was fetched and the model files are loaded, and while the engine is gone).
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from preprocessor.admission import Admission
from preprocessor.core import PreprocessorCore
from preprocessor.engine_link import EngineLink
from preprocessor.http.options import HttpOptions
from preprocessor.limits import Limits
from preprocessor.servicer import PreprocessorServicer
from splice.call_guard import CallGuard
from splice.drain import DEFAULT_GRACE, Drain
from splice.grpc_options import SERVER_OPTIONS, bind
from splice.security import Security
from splice.service_main import Resolve, freeze_startup_heap
from splice.v1 import preprocessor_pb2, preprocessor_pb2_grpc

log = logging.getLogger(__name__)
SERVICE = preprocessor_pb2.DESCRIPTOR.services_by_name["Preprocessor"].full_name
# Tensor payloads (embeds, images) ride in one Chat request: allow up to the largest caps.
MAX_RECEIVE_BYTES = 512 << 20


class PreprocessorServer:
    def __init__(self, *, engine: str | None = None, model: str | None = None, host: str = "127.0.0.1",
                 port: int = 0, limits: Limits | None = None, core: PreprocessorCore | None = None,
                 poll_interval: float = 2.0, resolve: Resolve | None = None, http: HttpOptions | None = None,
                 admission: Admission | None = None, security: Security | None = None,
                 engine_multiplex: bool = True) -> None:
        """Either `engine` (a HOST:PORT to watch) or a ready `core` (tests: files + ModelInfo supplied).
        `http`: also serve the OpenAI-compatible API (off when None)."""
        self.host, self.port = host, port
        self.http_port: int | None = None  # bound HTTP port once started
        self.security = security or Security()
        self.link = EngineLink(target=engine, core=core, model=model, limits=limits, poll_interval=poll_interval,
                               resolve=resolve, engine_tls=self.security.engine_tls,
                               engine_api_key=self.security.engine_api_key, engine_multiplex=engine_multiplex)
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._http_options = http
        self._http = None
        self.admission = admission or Admission()
        self._drain = Drain()

    @property
    def ready(self) -> asyncio.Event:
        """Set once the link can serve."""
        return self.link.ready

    async def start(self) -> int:
        """Binds and starts serving; returns the bound port (a free one when port == 0)."""
        # metrics, errors -> status codes, the key, admission and drain: one wrapper around each splice.v1 handler.
        # Drain inside admission: a call refused while draining gives its admitted bytes back on the way out.
        # With a key, reflection (the API's description, like the HTTP docs) needs it too unless opened.
        keyed_reflection = bool(self.security.api_key) and not self.security.open_docs
        guard = CallGuard(self._drain, api_key=self.security.api_key, admission=self.admission,
                          also=(f"/{reflection.SERVICE_NAME}/",) if keyed_reflection else ())
        tls = self.security.tls
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES), *SERVER_OPTIONS])
        guard.register(preprocessor_pb2_grpc.add_PreprocessorServicer_to_server,
                       PreprocessorServicer(self.link.core, self.admission, self.link.loras), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        guard.register(reflection_pb2_grpc.add_ServerReflectionServicer_to_server,
                       reflection.aio.ReflectionServicer([SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME]),
                       server)
        self.port = bind(server, self.host, self.port, tls.credentials() if tls else None)
        if self._http_options is not None:
            from preprocessor.http.app import build_app  # FastAPI is imported only when the face is on
            from preprocessor.http.server import HttpServer

            app = build_app(self.link, self._http_options, self.admission)
            options = self._http_options
            self._http = HttpServer(app, self.host, options.port, options.drain_grace, tls, options.header_timeout,
                                    options.max_connections, options.send_buffer_kb << 10)
            self.http_port = await self._http.start()
        await self._set_health(False)
        await server.start()
        self._server = server
        await self.link.start(on_serving=self._set_health)
        return self.port

    async def _set_health(self, serving: bool) -> None:
        if serving:
            freeze_startup_heap()  # the model files are loaded: full collections need not walk them
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE):
            await self._health.set(name, status)

    async def wait_for_termination(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()

    async def stop(self, grace: float = DEFAULT_GRACE) -> None:
        """Drains: health NOT_SERVING (and it stays so), new calls UNAVAILABLE, running ones get `grace` seconds."""
        await self._health.enter_graceful_shutdown()
        waits = [self._drain.drain(grace)]
        if self._http is not None:
            waits.append(self._http.stop())  # uvicorn stops listening and waits for its requests the same way
        left = (await asyncio.gather(*waits))[0]
        if left:
            log.warning("drain: %d calls still running after %.0f s; cancelling them", left, grace)
        if self._server is not None:
            await self._server.stop(0)
        await self.link.stop()  # after the drain: running streams still need the engine channel
        log.info("drained and stopped%s", f" ({left} calls cancelled)" if left else "")
