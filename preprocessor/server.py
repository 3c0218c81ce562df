"""grpc.aio server of splice.v1.Preprocessor: error interceptor, health, reflection, engine watcher.

Health is NOT_SERVING until the engine's ModelInfo has been fetched and the model files are loaded;
a watcher keeps polling the engine, so the server waits for an engine that is not up yet, reports
NOT_SERVING while it is gone, and serves again (reloading files if the model changed) once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from preprocessor.engine_client import EngineClient
from preprocessor.limits import Limits
from preprocessor.model_files import ModelFiles, load_model_files
from preprocessor.service import PreprocessorCore
from preprocessor.servicer import PreprocessorServicer
from splice.errors import SpliceError, Unavailable
from splice.grpc_errors import ErrorInterceptor
from splice.grpc_options import SERVER_OPTIONS, bind
from splice.metrics.preprocessor import ENGINE_CONNECTED
from splice.metrics_interceptor import MetricsInterceptor
from splice.model_info import ModelInfo
from splice.v1 import preprocessor_pb2, preprocessor_pb2_grpc

log = logging.getLogger(__name__)
SERVICE = preprocessor_pb2.DESCRIPTOR.services_by_name["Preprocessor"].full_name
# Tensor payloads (embeds, images) ride in one Chat request: allow up to the largest caps.
MAX_RECEIVE_BYTES = 512 << 20


class PreprocessorServer:
    def __init__(self, *, engine: str | None = None, model: str | None = None, host: str = "127.0.0.1",
                 port: int = 0, limits: Limits | None = None, core: PreprocessorCore | None = None,
                 poll_interval: float = 2.0, resolve: Callable[[str], str] | None = None) -> None:
        """Either `engine` (a HOST:PORT to watch) or a ready `core` (tests: files + ModelInfo supplied)."""
        if (engine is None) == (core is None):
            raise ValueError("pass exactly one of engine= or core=")
        self.host, self.port = host, port
        self._model = model
        self._limits = limits or Limits()
        self._core = core
        self._client = EngineClient(engine) if engine else None
        self._poll = poll_interval
        self._resolve = resolve
        self._files: dict[str, ModelFiles] = {}
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._watcher: asyncio.Task | None = None
        self.ready = asyncio.Event()  # set once a core can serve

    def core(self) -> PreprocessorCore:
        if self._core is None:
            target = self._client.target if self._client else "?"
            raise Unavailable(f"the preprocessor has not reached the engine at {target} yet")
        return self._core

    async def start(self) -> int:
        """Binds and starts serving; returns the bound port (a free one when port == 0)."""
        server = grpc.aio.server(interceptors=[MetricsInterceptor(), ErrorInterceptor()],  # outermost first
                                 options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES), *SERVER_OPTIONS])
        preprocessor_pb2_grpc.add_PreprocessorServicer_to_server(PreprocessorServicer(self.core), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection([SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        self.port = bind(server, self.host, self.port)
        await self._set_serving(False)
        await server.start()
        self._server = server
        if self._client is None:
            await self._set_serving(True)
        else:
            self._watcher = asyncio.create_task(self._watch_engine())
        return self.port

    async def _set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE):
            await self._health.set(name, status)
        ENGINE_CONNECTED.set(1 if serving else 0)
        if serving:
            self.ready.set()

    async def _watch_engine(self) -> None:
        assert self._client is not None
        serving = False
        while True:
            try:
                info = await self._client.get_model_info()
                if self._core is None or self._core.info != info:
                    files = await asyncio.to_thread(self._load, info)
                    self._core = PreprocessorCore(files, info, self._client, self._limits)
                    log.info("serving %s (engine %s)", info.model, self._client.target)
                if not serving:
                    await self._set_serving(True)
                    serving = True
            except Exception as exc:  # the watcher must outlive any failure, or the server never recovers
                message = exc.message if isinstance(exc, SpliceError) else f"{type(exc).__name__}: {exc}"
                if serving:
                    log.warning("engine lost: %s", message)
                    await self._set_serving(False)
                    serving = False
                else:
                    log.info("waiting for the engine: %s", message)
            await asyncio.sleep(self._poll)

    def _load(self, info: ModelInfo) -> ModelFiles:
        source = self._model or info.model
        if self._resolve is not None:
            source = self._resolve(source)
        if source not in self._files:
            self._files[source] = load_model_files(source)
        return self._files[source]

    async def wait_for_termination(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()

    async def stop(self, grace: float = 2.0) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)
        if self._client is not None:
            await self._client.close()
