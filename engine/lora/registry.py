"""The adapters an engine serves: every name it knows (--lora-modules, and those loaded at run time) with its folder,
and the adapters read into memory, at most --max-cpu-loras, least recently used dropped first (read again from
their folder when asked for). A request holds the adapter it was given until it ends, whatever is dropped meanwhile.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from engine.lora.adapter import LoraAdapter
from splice.errors import InvalidArgument, NotFound


class LoraRegistry:
    """Thread-safe: the event loop asks, loads run in threads."""

    def __init__(self, read: Callable[[str, str], LoraAdapter], max_cpu_loras: int) -> None:
        """`read(name, path)`: the adapter, checked against the model (engine/lora/adapter.py load_adapter)."""
        self.read = read
        self.max_cpu_loras = max_cpu_loras
        self.paths: dict[str, str] = {}  # name -> folder, every adapter served
        self._loaded: OrderedDict[str, LoraAdapter] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, name: str, path: str) -> LoraAdapter:
        """Reads and checks the adapter (InvalidArgument naming it when it cannot be served), then serves it as
        `name`."""
        with self._lock:
            if name in self.paths:
                raise InvalidArgument(f"The lora adapter '{name}' has already been loaded.")
        adapter = self.read(name, path)
        with self._lock:
            if name in self.paths:
                raise InvalidArgument(f"The lora adapter '{name}' has already been loaded.")
            self.paths[name] = path
            self._keep(adapter)
        return adapter

    def remove(self, name: str) -> None:
        with self._lock:
            if self.paths.pop(name, None) is None:
                raise NotFound(f"The lora adapter '{name}' cannot be found.")
            self._loaded.pop(name, None)

    def cached(self, name: str) -> LoraAdapter | None:
        """The adapter when it is in memory (no disk read): most requests."""
        with self._lock:
            found = self._loaded.get(name)
            if found is not None:
                self._loaded.move_to_end(name)
            return found

    def get(self, name: str) -> LoraAdapter:
        """The adapter served as `name`, read again from its folder when it was dropped; NotFound when no adapter
        has that name."""
        found = self.cached(name)
        if found is not None:
            return found
        with self._lock:
            path = self.paths.get(name)
        if path is None:
            raise NotFound(f"The model `{name}` does not exist.")
        adapter = self.read(name, path)
        with self._lock:
            if self.paths.get(name) != path:  # unloaded (or replaced) meanwhile
                raise NotFound(f"The model `{name}` does not exist.")
            return self._keep(adapter)

    def _keep(self, adapter: LoraAdapter) -> LoraAdapter:
        self._loaded[adapter.name] = adapter
        self._loaded.move_to_end(adapter.name)
        while len(self._loaded) > self.max_cpu_loras:
            self._loaded.popitem(last=False)
        return adapter

    @property
    def served(self) -> dict[str, str]:
        """Name -> folder of every adapter served."""
        with self._lock:
            return dict(self.paths)

    @property
    def loaded(self) -> list[str]:
        """Names in memory now, least recently used first."""
        with self._lock:
            return list(self._loaded)
