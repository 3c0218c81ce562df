"""The routes of the OpenAI-compatible face, as vLLM names them. A generating route is decode -> one core pipeline
(preprocessor/answer.py) -> encode, like the gRPC servicer: decode.py checks the body and says what it asks,
answer.py prepares its answer, responses.py and streaming.py send it. Each route takes what it serves from (the
engine link, the options) as a dependency (serving.py); build_app (app.py) mounts `api` and `open_routes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from importlib.metadata import version as distribution_version
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from preprocessor.answer import prepare_chat, prepare_complete
from preprocessor.http.body import OffLoopJsonRoute
from preprocessor.http.decode import conversation, decode_chat, decode_completion
from preprocessor.http.errors import error_response
from preprocessor.http.loras import adapter_cards
from preprocessor.http.media import fetch_remote_images
from preprocessor.http.responses import chat_shape, completion_shape
from preprocessor.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeRequest,
)
from preprocessor.http.serving import Serving, app_serving
from preprocessor.http.streaming import respond, until_disconnected
from splice.errors import InvalidArgument, SpliceError

log = logging.getLogger(__name__)

SPLICE_VERSION = distribution_version("splice")
RESET_QUERY = ("reset_running_requests", "reset_external")

api = APIRouter(route_class=OffLoopJsonRoute)  # the API: admitted, keyed (large bodies parsed off the loop: body.py)
open_routes = APIRouter()  # health, version, metrics


@api.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           serving: Annotated[Serving, Depends(app_serving)]) -> Response:
    served = await serving.served(body.model)
    chat = await decode_chat(served.core, body, len(await request.body()), served.lora)
    conv = await fetch_remote_images(chat.conv, serving.options, served.core.limits.max_image_bytes)
    answer = await until_disconnected(request, prepare_chat(served.core, conv, chat.sampling, chat.asked))
    return await respond(request, answer, chat_shape(answer, body, served), body.stream)


@api.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request,
                      serving: Annotated[Serving, Depends(app_serving)]) -> Response:
    served = await serving.served(body.model)
    completion = await decode_completion(body, len(await request.body()), served.lora)
    answer = await until_disconnected(request, prepare_complete(served.core, completion.prompts, completion.sampling,
                                                                completion.asked, body.add_special_tokens))
    return await respond(request, answer, completion_shape(answer, body, served), body.stream)


@api.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request, serving: Annotated[Serving, Depends(app_serving)],
                             reset_running_requests: bool = False, reset_external: bool = False) -> Response:
    """vLLM's: forgets every engine replica's cached prefixes, 200 with no body when each was reset; otherwise 503
    (every failure an unreachable replica) or 502, naming each replica that was not reset and why. reset_external:
    there is no external (connector-held) prefix cache here, so true asks for nothing more."""
    unknown = sorted(set(request.query_params) - set(RESET_QUERY))
    if unknown:
        raise InvalidArgument(f"/reset_prefix_cache takes the query parameters {', '.join(RESET_QUERY)}; got "
                              f"{', '.join(unknown)[:200]}")
    if reset_running_requests:
        raise InvalidArgument("reset_running_requests=true is not supported: running requests are not preempted; "
                              "they keep their blocks (the reset forgets every other cached prefix), so leave it "
                              "false or unset")
    link = serving.link
    log.info("resetting the prefix cache of every engine replica at %s", link.target)
    done, failed = await link.reset_prefix_cache()
    if not failed:
        return Response(status_code=200)
    unavailable = all(f.code == "UNAVAILABLE" for f in failed)
    named = "; ".join(f"{f.address} ({f.code}: {f.message})" for f in failed)
    message = (f"the prefix cache was reset on {len(done)} of {len(done) + len(failed)} engine replicas at "
               f"{link.target}; not on: {named}")
    log.warning("%s", message)
    return error_response(503 if unavailable else 502, message)


def model_card(name: str, root: str, max_model_len: int | None, created: int, parent: str | None = None) -> dict:
    """vLLM's /v1/models entry (its permission block included, as vLLM fills it)."""
    permission = {"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission", "created": created,
                  "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                  "group": None, "is_blocking": False}
    return {"id": name, "object": "model", "created": created, "owned_by": "splice", "root": root, "parent": parent,
            "max_model_len": max_model_len, "permission": [permission]}


@api.get("/v1/models")
async def models(serving: Annotated[Serving, Depends(app_serving)]) -> dict:
    core = serving.core(None)
    created = int(time.time())
    with contextlib.suppress(SpliceError):  # (the engine unreachable now: the adapters it served last)
        await serving.link.loras.refresh()
    names = serving.names(core)
    return {"object": "list", "data": [*(model_card(name, core.info.model, core.info.max_model_len, created)
                                         for name in names),
                                       *adapter_cards(serving.link, names[0], created, model_card)]}


@api.post("/tokenize")
async def tokenize(body: TokenizeRequest, serving: Annotated[Serving, Depends(app_serving)]) -> dict:
    core = serving.core(body.model)
    if isinstance(body, TokenizeChatRequest):
        conv = await asyncio.to_thread(conversation, core, body)
        conv = await fetch_remote_images(conv, serving.options, core.limits.max_image_bytes)
        result = await core.tokenize_chat(conv)
    else:
        result = await asyncio.to_thread(core.tokenize_text, body.prompt, body.add_special_tokens)
    tokens = list(result.token_ids)
    # vLLM's: the vocabulary's pieces (a byte-level BPE's "Ġla"), not decoded text
    strs = await asyncio.to_thread(core.files.tokenizer.convert_ids_to_tokens, tokens) \
        if body.return_token_strs else None
    return {"count": len(tokens), "max_model_len": core.info.max_model_len, "tokens": tokens, "token_strs": strs}


@api.post("/detokenize")
async def detokenize(body: DetokenizeRequest, serving: Annotated[Serving, Depends(app_serving)]) -> dict:
    core = serving.core(body.model)
    return {"prompt": await asyncio.to_thread(core.detokenize, body.tokens, True)}


@open_routes.get("/health")
async def health(serving: Annotated[Serving, Depends(app_serving)]) -> Response:
    if serving.link.serving:
        return Response(status_code=200)
    return error_response(503, f"not serving: the engine at {serving.link.target} is not reachable")


@open_routes.get("/version")
async def version() -> dict:
    return {"version": SPLICE_VERSION}  # open, as vLLM's /version and /health


@open_routes.get("/metrics")
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
