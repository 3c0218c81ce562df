"""LoRA adapters on the HTTP face, as vLLM's: a request's `model` names the base model or an adapter (vLLM's 404 for
any other name), /v1/models lists each adapter with `parent` the base, and POST /v1/load_lora_adapter and
/v1/unload_lora_adapter (routes that exist only behind --allow-runtime-lora-updating, vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING, and need the API key as every route does) serve and drop adapters on every engine
replica."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from preprocessor.core import PreprocessorCore
from preprocessor.engine_link import EngineLink
from splice.errors import NotFound, SpliceError


async def served(link: EngineLink, names: tuple[str, ...], model: str | None) -> tuple[PreprocessorCore, str]:
    """(the core, the adapter's name or "" for the base model) of a request's `model`: one of the base model's served
    `names` (vLLM's --served-model-name), an adapter's name, or None (the base)."""
    core = link.core()
    if model is None or model in names:
        return core, ""
    try:
        return core, await link.loras.check(model)
    except NotFound:
        adapters = f" and its LoRA adapters {sorted(link.loras.adapters)}" if link.loras.adapters else ""
        raise NotFound(f"The model `{model}` does not exist: it is not served here; this server serves "
                       f"{', '.join(map(repr, names))}{adapters}", param="model") from None
    except SpliceError as exc:  # (the engine cannot be asked now)
        raise NotFound(f"The model `{model}` does not exist: {exc.message}", param="model") from None


def adapter_cards(link: EngineLink, base: str, created: int, card: Callable[..., dict]) -> list[dict]:
    """vLLM's /v1/models entries of the adapters (`card` makes one: id the name, root its folder, parent the base
    model's first served name)."""
    return [card(name, path, None, created, parent=base) for name, path in sorted(link.loras.adapters.items())]


class LoadLoraAdapterRequest(BaseModel):
    lora_name: str = ""
    lora_path: str = ""
    load_inplace: bool = False


class UnloadLoraAdapterRequest(BaseModel):
    lora_name: str = ""
    lora_int_id: int | None = None


def lora_routes(link: EngineLink) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoraAdapterRequest) -> PlainTextResponse:
        if body.load_inplace and body.lora_name in await link.loras.refresh():
            await link.loras.unload(body.lora_name)
        await link.loras.load(body.lora_name, body.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @api.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoraAdapterRequest) -> PlainTextResponse:
        await link.loras.unload(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    return api
