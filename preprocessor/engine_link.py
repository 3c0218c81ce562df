"""The preprocessor's link to its engine: the current core, and whether it can serve.

A watcher polls the engine's ModelInfo, so the preprocessor waits for an engine that is not up yet,
stops serving while it is gone, and serves again (reloading the model files if the model changed) once
it is back. Each face (gRPC and HTTP) asks the link for the core of each request; `on_serving` tells the
server when readiness changes, so it can flip its health status.

The target may be several replicas, and each poll may reach another one. The link moves to another model
only when SWITCH_POLLS polls in a row report it (the whole fleet changed); a lone replica serving another model
does not flip the link back and forth: it refuses the requests it gets (their model fingerprint differs)
and names itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from preprocessor.core import PreprocessorCore
from preprocessor.engine_client import EngineClient
from preprocessor.engine_replicas import ReplicaFailure
from preprocessor.limits import Limits
from preprocessor.loras import LoraCatalog
from preprocessor.metrics import ENGINE_CONNECTED
from preprocessor.model_files import ModelFiles, load_model_files
from preprocessor.template_sandbox import TemplateSandbox
from splice.errors import FailedPrecondition, SpliceError, Unavailable
from splice.model_info import ModelInfo
from splice.security import ClientTLS
from splice.service_main import Resolve

log = logging.getLogger(__name__)

OnServing = Callable[[bool], Awaitable[None]]
SWITCH_POLLS = 3
WAITING_EVERY = 30.0  # seconds between "waiting for the engine" lines (every poll logs at DEBUG)


class EngineLink:
    """Either watches an engine (`target`), or serves a fixed core (tests: files + ModelInfo supplied)."""

    def __init__(self, *, target: str | None = None, core: PreprocessorCore | None = None, model: str | None = None,
                 limits: Limits | None = None, poll_interval: float = 2.0, resolve: Resolve | None = None,
                 engine_tls: ClientTLS | None = None, engine_api_key: str | None = None, engine_multiplex: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if (target is None) == (core is None):
            raise ValueError("pass exactly one of target= or core=")
        self._core = core
        self._client = EngineClient(target, engine_tls, engine_api_key, engine_multiplex) if target else None
        self.loras = LoraCatalog(self._client)  # the engine's LoRA adapters (preprocessor/loras.py)
        self._model = model  # where the model files come from; default: the model the engine reports
        self._limits = limits or Limits()
        # One sandbox for every core this link builds (a core is rebuilt when the engine's model changes).
        self._sandbox = TemplateSandbox(self._limits.chat_template_workers, self._limits.chat_template_timeout) \
            if self._limits.trust_request_chat_template and target else None
        self._poll = poll_interval
        self._resolve = resolve
        self._files: dict[str, ModelFiles] = {}  # by source folder: an engine restart reuses them
        self._watcher: asyncio.Task | None = None
        self._on_serving: OnServing | None = None
        self.serving = False
        self._clock = clock
        self._waiting_said: float | None = None  # when "waiting for the engine" was last logged
        self.ready = asyncio.Event()  # set once a core can serve (the first time)
        self._other: tuple[ModelInfo, int] | None = None  # another model seen, and in how many polls in a row

    @property
    def target(self) -> str:
        return self._client.target if self._client else "(in-process core)"

    def core(self) -> PreprocessorCore:
        """The core for the next request; Unavailable before the engine was first reached."""
        if self._core is None:
            raise Unavailable(f"the preprocessor has not reached the engine at {self.target} yet")
        return self._core

    async def reset_prefix_cache(self) -> tuple[list[str], list[ReplicaFailure]]:
        """Every engine replica's prefix cache reset: the addresses reset, and those that failed."""
        if self._client is None:
            raise FailedPrecondition("this preprocessor serves an in-process core: there is no engine to reset")
        return await self._client.reset_prefix_cache()

    async def start(self, on_serving: OnServing | None = None) -> None:
        self._on_serving = on_serving
        await self._set_serving(False)
        if self._client is None:
            await self._set_serving(True)
        else:
            self._watcher = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._client is not None:
            await self._client.close()
        if self._sandbox is not None:
            self._sandbox.close()
        elif self._core is not None:
            self._core.close()

    async def _set_serving(self, serving: bool) -> None:
        self.serving = serving
        ENGINE_CONNECTED.set(1 if serving else 0)
        if self._on_serving is not None:
            await self._on_serving(serving)
        if serving:
            self.ready.set()

    async def _watch(self) -> None:
        assert self._client is not None
        while True:
            try:
                info = await self._client.get_model_info()
                if self._switch_to(info):
                    files = await asyncio.to_thread(self._load, info)
                    self._core = PreprocessorCore(files, info, self._client, self._limits, self._sandbox)
                    log.info("serving %s (engine %s)", info.model, self._client.target)
                    await self.loras.refresh()
                if not self.serving:
                    await self._set_serving(True)
            except Exception as exc:  # the watcher must outlive any failure, or the link never recovers
                message = exc.message if isinstance(exc, SpliceError) else f"{type(exc).__name__}: {exc}"
                log.debug("engine poll: %s", message)
                if self.serving:
                    log.warning("engine lost: %s", message)
                    await self._set_serving(False)
                    self._waiting_said = self._clock()
                elif self._waiting_said is None or self._clock() - self._waiting_said >= WAITING_EVERY:
                    log.info("waiting for the engine: %s", message)  # once, then every WAITING_EVERY seconds
                    self._waiting_said = self._clock()
            else:
                self._waiting_said = None
            await asyncio.sleep(self._poll)

    def _switch_to(self, info: ModelInfo) -> bool:
        """Whether the core must be rebuilt for `info` (the first model, or another one SWITCH_POLLS times)."""
        if self._core is None:
            return True
        if self._core.info == info:
            self._other = None
            return False
        seen = self._other[1] + 1 if self._other is not None and self._other[0] == info else 1
        self._other = (info, seen)
        if seen < SWITCH_POLLS:
            log.warning("an engine replica at %s serves %s (fingerprint %s), not %s (%s); its requests are refused "
                        "unless every poll sees it", self.target, info.model, info.fingerprint, self._core.info.model,
                        self._core.info.fingerprint)
            return False
        self._other = None
        return True

    def _load(self, info: ModelInfo) -> ModelFiles:
        source = self._model or info.model
        if self._resolve is not None:
            source = self._resolve(source)
        if source not in self._files:
            self._files[source] = load_model_files(source)
        return self._files[source]
