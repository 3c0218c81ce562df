"""The LoRA adapters the engine serves, as the preprocessor knows them: a request's adapter name is checked here
before any of its work is done (vLLM's 404 for a name not served), /v1/models lists them, and the runtime loads and
unloads (vLLM's /v1/load_lora_adapter, /v1/unload_lora_adapter) go to every engine replica.

The engine is the authority: the names are its ListLoraAdapters answer, asked again for a name not known here (it
may have been loaded through another preprocessor), so a name is refused only once the engine has said it does not
serve it. A name unloaded elsewhere since is refused by the engine itself (NOT_FOUND, the same 404).
"""

from __future__ import annotations

from preprocessor.engine_client import EngineClient, EngineError
from preprocessor.engine_replicas import ReplicaFailure
from splice.errors import FailedPrecondition, InvalidArgument, NotFound, SpliceError


def not_served(name: str) -> NotFound:
    return NotFound(f"The model `{name}` does not exist.")


class LoraCatalog:
    def __init__(self, client: EngineClient | None) -> None:
        self._client = client  # None: an in-process core, no engine to serve adapters
        self.enabled = False  # the engine serves adapters (--enable-lora)
        self.adapters: dict[str, str] = {}  # name -> the adapter's folder on the engine's machine

    async def refresh(self) -> dict[str, str]:
        """The engine's adapters now (an engine of a version without adapters serves none)."""
        if self._client is not None:
            try:
                self.enabled, self.adapters = await self._client.lora_adapters()
            except SpliceError as exc:
                if exc.code != "UNIMPLEMENTED":
                    raise
                self.enabled, self.adapters = False, {}
        return self.adapters

    async def check(self, name: str) -> str:
        """`name` when the engine serves an adapter of that name; NotFound (vLLM's message) otherwise."""
        if name not in self.adapters:
            await self.refresh()
            if name not in self.adapters:
                raise not_served(name)
        return name

    async def load(self, name: str, path: str) -> None:
        """Serves the adapter on every engine replica; the first replica's refusal when it is refused (naming the
        adapter), SpliceError naming each replica that failed otherwise."""
        if not name or not path:
            raise InvalidArgument("Both 'lora_name' and 'lora_path' must be provided.")
        await self._every(await self._engine().load_lora_adapter(name, path), f"loaded the LoRA adapter {name!r}")

    async def unload(self, name: str) -> None:
        if not name:
            raise InvalidArgument("'lora_name' needs to be provided to unload a LoRA adapter.")
        await self._every(await self._engine().unload_lora_adapter(name), f"unloaded the LoRA adapter {name!r}")

    def _engine(self) -> EngineClient:
        if self._client is None:
            raise FailedPrecondition("this preprocessor serves an in-process core: no engine serves adapters")
        return self._client

    async def _every(self, outcome: tuple[list[str], list[ReplicaFailure]], what: str) -> None:
        done, failed = outcome
        await self.refresh()
        if not failed:
            return
        if not done and len({(f.code, f.message) for f in failed}) == 1:  # every replica refused it alike
            raise EngineError(failed[0].code, failed[0].message)
        named = "; ".join(f"{f.address} ({f.code}: {f.message})" for f in failed)
        raise SpliceError(f"{what} on {len(done)} of {len(done) + len(failed)} engine replicas; not on: {named}")
