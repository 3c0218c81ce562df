"""The engine's LoRA face: the adapter a request names, and the adapters served (--lora-modules at start, vLLM's
load and unload endpoints at run time). Off when the engine was started without --enable-lora: a request naming an
adapter, and a load or unload, are then refused naming the flag."""

from __future__ import annotations

import asyncio
import functools

from engine.config import EngineConfig
from engine.loader import LoadedModel
from engine.lora.adapter import LoraAdapter, load_adapter
from engine.lora.registry import LoraRegistry
from splice.errors import FailedPrecondition, InvalidArgument

OFF = "this engine serves no LoRA adapters (start it with --enable-lora)"


class ServedLoras:
    def __init__(self, cfg: EngineConfig, m: LoadedModel) -> None:
        """Every --lora-modules adapter is read and checked (the first that cannot be served stops the engine, its
        one line naming it)."""
        self.base = m.info.model
        self.registry: LoraRegistry | None = None
        if cfg.enable_lora:
            read = functools.partial(load_adapter, targets=m.lora_targets, max_rank=cfg.max_lora_rank,
                                     hidden_size=m.info.hidden_size, device=m.device, dtype=m.dtype)
            self.registry = LoraRegistry(read, cfg.cpu_loras)
            for name, path in cfg.lora_modules:
                self.registry.add(name, path)

    @property
    def enabled(self) -> bool:
        return self.registry is not None

    @property
    def served(self) -> dict[str, str]:
        """Name -> folder of every adapter served (empty with LoRA off)."""
        return self.registry.served if self.registry is not None else {}

    def _on(self) -> LoraRegistry:
        if self.registry is None:
            raise FailedPrecondition(OFF)
        return self.registry

    async def adapter(self, name: str) -> LoraAdapter | None:
        """The adapter a request names ("" = the base model): NotFound for a name not served (read from its folder in
        a thread when it is not in memory)."""
        if not name:
            return None
        if self.registry is None:
            raise FailedPrecondition(f"{OFF}; the request asked for {name!r}")
        found = self.registry.cached(name)
        return found if found is not None else await asyncio.to_thread(self.registry.get, name)

    def get(self, name: str) -> LoraAdapter:
        return self._on().get(name)

    async def load(self, name: str, path: str) -> None:
        """Serves the PEFT adapter in folder `path` as `name` from now on (vLLM's /v1/load_lora_adapter): read and
        checked in a thread; InvalidArgument naming it when it cannot be served or the name is taken."""
        registry = self._on()
        if not name or name == self.base:
            raise InvalidArgument(f"a LoRA adapter cannot be named {name!r} (the base model's name, or empty)")
        await asyncio.to_thread(registry.add, name, path)

    def unload(self, name: str) -> None:
        """Stops serving adapter `name` (requests already running under it finish under it); NotFound when no adapter
        has that name."""
        self._on().remove(name)
