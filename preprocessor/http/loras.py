"""LoRA adapters on the HTTP face, as vLLM's: a request's `model` names the base model or an adapter (serving.py),
/v1/models lists each adapter with `parent` the base (adapter_cards), and POST /v1/load_lora_adapter and
/v1/unload_lora_adapter (routes that exist only behind --allow-runtime-lora-updating, vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING, and need the API key as every route does) serve and drop adapters on every engine
replica."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from preprocessor.engine_link import EngineLink
from preprocessor.http.serving import Serving, app_serving


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


lora_routes = APIRouter()  # mounted by build_app behind --allow-runtime-lora-updating


@lora_routes.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraAdapterRequest,
                            serving: Annotated[Serving, Depends(app_serving)]) -> PlainTextResponse:
    loras = serving.link.loras
    if body.load_inplace and body.lora_name in await loras.refresh():
        await loras.unload(body.lora_name)
    await loras.load(body.lora_name, body.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@lora_routes.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraAdapterRequest,
                              serving: Annotated[Serving, Depends(app_serving)]) -> PlainTextResponse:
    await serving.link.loras.unload(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
