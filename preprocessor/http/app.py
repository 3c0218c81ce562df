"""The FastAPI app of the OpenAI-compatible face: each route is decode -> one core call -> encode, like the
gRPC servicer, on the engine link's current core. OpenAPI page at /docs.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from preprocessor.admission import Admission
from preprocessor.core import PreprocessorCore
from preprocessor.engine_link import EngineLink
from preprocessor.http import convert
from preprocessor.http.admission import AdmissionMiddleware
from preprocessor.http.auth import bearer_check
from preprocessor.http.errors import error_response, install_error_handlers
from preprocessor.http.media import fetch_images
from preprocessor.http.options import HttpOptions
from preprocessor.http.responses import ChatShape, Shape
from preprocessor.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeRequest,
)
from preprocessor.http.streaming import ClientGone, stream_response, whole_response
from splice.errors import NotFound

# Not a real status: nginx's "client closed request", for the log line of an answer nobody reads.
CLIENT_CLOSED = 499


def _core(link: EngineLink, model: str | None) -> PreprocessorCore:
    core = link.core()
    if model is not None and model != core.info.model:
        raise NotFound(f"model {model!r} is not served here; this server serves {core.info.model!r}")
    return core


def build_app(link: EngineLink, options: HttpOptions, admission: Admission | None = None) -> FastAPI:
    """`admission`: shared with the gRPC face, so one set of caps covers both."""
    app = FastAPI(title="Splice", summary="OpenAI-compatible API (vLLM's format) of the Splice preprocessor")
    install_error_handlers(app)
    if admission is not None:
        app.add_middleware(AdmissionMiddleware, admission=admission)
    api = APIRouter(dependencies=[Depends(bearer_check(options.api_key))])

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @api.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        core = _core(link, body.model)
        sampling = convert.chat_sampling(body)
        fetched = await fetch_images(convert.remote_images(body.messages), options, core.limits.max_image_bytes)
        conv = convert.conversation_from_http(body, fetched)
        request_id = body.request_id or uuid.uuid4().hex
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        shape = ChatShape(request_id, core.info.model, core.token_texts, body.logprobs, include_usage)
        chunks = core.chat(conv, sampling, request_id)
        if body.stream:
            return await stream_response(request, chunks, shape)
        return await whole_response(request, chunks, shape)

    @api.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        core = _core(link, body.model)
        sampling = convert.completion_sampling(body)
        parts = convert.prompt_from_http(body)
        request_id = body.request_id or uuid.uuid4().hex
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        shape = Shape(request_id, core.info.model, core.token_texts, sampling.logprobs, include_usage)
        chunks = core.complete(parts, sampling, request_id)
        if body.stream:
            return await stream_response(request, chunks, shape)
        return await whole_response(request, chunks, shape)

    @api.get("/v1/models")
    async def models() -> dict:
        info = _core(link, None).info
        return {"object": "list", "data": [{"id": info.model, "object": "model", "created": int(time.time()),
                                            "owned_by": "splice", "root": info.model,
                                            "max_model_len": info.max_model_len}]}

    @api.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        core = _core(link, body.model)
        if isinstance(body, TokenizeChatRequest):
            fetched = await fetch_images(convert.remote_images(body.messages), options, core.limits.max_image_bytes)
            conv = convert.conversation_from_http(body, fetched)
            result = await core.tokenize_chat(conv)
        else:
            result = await asyncio.to_thread(core.tokenize_text, body.prompt, body.add_special_tokens)
        tokens = list(result.token_ids)
        strs = await asyncio.to_thread(core.token_texts, tokens) if body.return_token_strs else None
        return {"count": len(tokens), "max_model_len": core.info.max_model_len, "tokens": tokens, "token_strs": strs}

    @api.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        core = _core(link, body.model)
        return {"prompt": await asyncio.to_thread(core.detokenize, body.tokens, True)}

    @app.get("/health")
    async def health() -> Response:
        if link.serving:
            return Response(status_code=200)
        return error_response(503, f"not serving: the engine at {link.target} is not reachable", "UNAVAILABLE")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(api)
    return app

