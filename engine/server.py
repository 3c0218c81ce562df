"""The engine's grpc.aio server: Engine service, health (NOT_SERVING until loaded and warm), reflection."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from engine.byte_budget import ByteBudget
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.servicer import MULTIPLEX, EngineServicer
from splice.call_guard import CallGuard
from splice.drain import DEFAULT_GRACE, Drain
from splice.grpc_options import SERVER_OPTIONS, bind, max_connection_age_options
from splice.security import ServerTLS
from splice.service_main import freeze_startup_heap
from splice.v1 import engine_pb2, engine_pb2_grpc

log = logging.getLogger(__name__)
SERVICE = engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name


class EngineServer:
    """Binds first (health answers NOT_SERVING while the model loads), then loads, warms up, serves."""

    def __init__(self, cfg: EngineConfig, host: str = "127.0.0.1", port: int = 0,
                 engine: LLMEngine | None = None, tls: ServerTLS | None = None, api_key: str | None = None,
                 max_connection_age: float | None = None) -> None:
        """`tls`: serve TLS (mTLS with its CA); `api_key`: the key preprocessors must present;
        `max_connection_age`: seconds after which a connection is closed (its streams finish), so that clients
        re-resolve their target and find replicas started since."""
        self.cfg = cfg
        self.host = host
        self.engine = engine
        self._drain = Drain()
        # metrics, errors -> status codes, the key and drain: one wrapper around each splice.v1 handler
        guard = CallGuard(self._drain, api_key=api_key, uncounted=(MULTIPLEX,))  # its calls are counted
        self.server = grpc.aio.server(options=SERVER_OPTIONS + max_connection_age_options(max_connection_age))
        # engine attached once warm
        self.servicer = EngineServicer(budget=ByteBudget(cfg.max_inflight_tensor_bytes),
                                       upload_idle_timeout=cfg.upload_idle_timeout, drain=self._drain)
        guard.register(engine_pb2_grpc.add_EngineServicer_to_server, self.servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self.server)
        self.port = bind(self.server, host, port, tls.credentials() if tls else None)
        self.servicer.replica = f"{self.address} on {socket.gethostname()}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def _set(self, status: int) -> None:
        for name in ("", SERVICE):
            await self.health.set(name, status)

    async def start(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Listens (health NOT_SERVING), loads and warms the engine, then flips health to SERVING."""
        await self.listen()
        await self.load()
        if on_ready:
            on_ready(self.address)

    async def listen(self) -> None:
        await self._set(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()

    async def load(self) -> None:
        if self.engine is None:
            # loading is seconds of blocking torch work: off the event loop so health keeps answering
            self.engine = await asyncio.to_thread(LLMEngine, self.cfg)
        self.engine.start()
        await self.engine.warmup()
        self.servicer.engine = self.engine
        freeze_startup_heap()  # the model and its warm-up are in: full collections need not walk them
        await self._set(health_pb2.HealthCheckResponse.SERVING)
        log.info("engine serving %s on %s", self.engine.info.model, self.address)

    async def stop(self, grace: float = DEFAULT_GRACE) -> None:
        """Drains: health NOT_SERVING, new calls UNAVAILABLE, running streams get `grace` seconds to finish."""
        await self.health.enter_graceful_shutdown()
        if left := await self._drain.drain(grace):
            log.warning("drain: %d calls still running after %.0f s; cancelling them", left, grace)
        await self.server.stop(0)
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop)
        log.info("drained and stopped%s", f" ({left} calls cancelled)" if left else "")
