"""The FastAPI app of the OpenAI-compatible face: each route is decode -> one core call -> encode, like the
gRPC servicer, on the engine link's current core. OpenAPI page at /docs. With a key, every route but /health
needs it (auth.py), /metrics and the docs unless opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from importlib.metadata import version as _dist_version

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from preprocessor.admission import Admission, charge
from preprocessor.content import PromptPart, Text, TokenIds
from preprocessor.core import MAX_DETOKENIZE_IDS, Prepared, PreprocessorCore
from preprocessor.engine_link import EngineLink
from preprocessor.http import convert
from preprocessor.http.admission import AdmissionMiddleware
from preprocessor.http.auth import KeyMiddleware
from preprocessor.http.body import Caps, OffLoopJsonRoute
from preprocessor.http.decode import conversation, decode_chat, decode_completion
from preprocessor.http.errors import error_response, install_error_handlers
from preprocessor.http.loras import adapter_cards, lora_routes, served
from preprocessor.http.media import fetch_remote_images
from preprocessor.http.options import HttpOptions
from preprocessor.http.responses import ChatShape, Shape
from preprocessor.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeRequest,
)
from preprocessor.http.streaming import ClientGone, stream_response, until_disconnected, whole_response
from preprocessor.http.token_strings import TokenStrings
from preprocessor.request_bounds import max_chars
from preprocessor.tools.request import MAX_TOOLS
from splice.errors import InvalidArgument, NotFound, SpliceError
from splice.request_rules import VOCABULARY_BOUNDED
from splice.sampling import SamplingParams

log = logging.getLogger(__name__)

# Not a real status: nginx's "client closed request", for the log line of an answer nobody reads.
CLIENT_CLOSED = 499
SPLICE_VERSION = _dist_version("splice")


def _core(link: EngineLink, options: HttpOptions, model: str | None) -> PreprocessorCore:
    """The core, for a request naming `model`: one of the served names (vLLM's --served-model-name; by default the
    model's own name), or none. (Routes that may name an adapter ask `served`.)"""
    core = link.core()
    names = served_names(options, core)
    if model is not None and model not in names:
        raise NotFound(f"model {model!r} is not served here; this server serves {', '.join(map(repr, names))}",
                       param="model")
    return core


async def _served(link: EngineLink, options: HttpOptions, model: str | None) -> tuple[PreprocessorCore, str]:
    """(the core, the LoRA adapter's name or "" for the base model) of a generating request's `model`."""
    return await served(link, served_names(options, link.core()), model)


def served_names(options: HttpOptions, core: PreprocessorCore) -> tuple[str, ...]:
    return options.served_model_names or (core.info.model,)


def _strings(core: PreprocessorCore, options: HttpOptions, asked: bool | None) -> TokenStrings:
    """How the request's logprobs spell tokens; `asked`: its return_tokens_as_token_ids (None: the server's)."""
    as_ids = options.return_tokens_as_token_ids if asked is None else asked
    return TokenStrings(core.token_texts, core.decode_ids, as_ids)


def _model_card(name: str, root: str, max_model_len: int | None, created: int, parent: str | None = None) -> dict:
    """vLLM's /v1/models entry (its permission block included, as vLLM fills it)."""
    permission = {"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission", "created": created,
                  "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                  "group": None, "is_blocking": False}
    return {"id": name, "object": "model", "created": created, "owned_by": "splice", "root": root, "parent": parent,
            "max_model_len": max_model_len, "permission": [permission]}


def _body_caps(link: EngineLink) -> Caps:
    """What a large body's fields may hold, for the model served now (body.py counts them as it parses)."""
    core = link.core()
    info = core.info
    vocab = (info.vocab_rows, f"each names a token of the engine's vocabulary of {info.vocab_rows} (vLLM's rule)")
    positions = (info.max_model_len, f"each takes a position of the engine's max_model_len {info.max_model_len}")
    chars = max_chars(info, core.files)
    prompts = max(info.max_model_len, core.limits.max_prompts)
    return Caps({**dict.fromkeys(VOCABULARY_BOUNDED, vocab), "messages": positions,
                 "prompt": (prompts, f"a prompt's token IDs take positions of the engine's max_model_len "
                                     f"{info.max_model_len}; a request has at most {core.limits.max_prompts} prompts"),
                 "tools": (MAX_TOOLS, "the tools a request may carry"),
                 "tokens": (MAX_DETOKENIZE_IDS, "the token IDs one /detokenize takes")},
                default=(max(chars, info.vocab_rows), f"no field of a request to this model holds more (the prompt's "
                                                       f"{chars} characters, the vocabulary's tokens)"))


def _echo_prompts(core: PreprocessorCore, body: CompletionRequest, prompts: list[list[PromptPart]]) -> list[str]:
    """Each prompt's text as `echo` returns it, as vLLM's: a text prompt as sent, token IDs decoded (special tokens
    kept); "" with return_token_ids (vLLM's: the IDs say it)."""
    if body.return_token_ids:
        return [""] * len(prompts)
    return ["".join(p.text if isinstance(p, Text) else core.detokenize(p.ids, False) if isinstance(p, TokenIds)
                    else "" for p in prompt) for prompt in prompts]


def _charge_whole_answer(core: PreprocessorCore, prepared: Prepared, shape: Shape, sampling: SamplingParams) -> None:
    """A whole answer is held until it is sent: what its choices may hold (n x max_tokens per prompt, and the prompt
    logprobs, shown on each completions choice) is charged to the request's admission before any is generated (a
    streamed one holds only the chunk in flight)."""
    tokens = core.answer_tokens(prepared)
    alternatives = len(sampling.logprob_token_ids) or sampling.top_logprobs  # each token's, when it has logprobs
    nbytes = tokens * shape.token_bytes(alternatives)
    what = f"the whole answer ({prepared.choices} choice(s), up to {tokens} tokens together: n x max_tokens"
    if sampling.prompt_logprobs is not None:
        positions = sum(p.request.prompt_len for p in prepared.prompts)
        nbytes += positions * shape.prompt_position_bytes(sampling.prompt_logprobs, alternatives)
        what += f"; prompt logprobs of {positions} positions"
    charge(nbytes, what + ")")


RESET_QUERY = ("reset_running_requests", "reset_external")


async def _reset_prefix_cache(link: EngineLink, request: Request, reset_running_requests: bool) -> Response:
    """vLLM's /reset_prefix_cache on every engine replica: 200 with no body when each was reset; otherwise 503 (every
    failure an unreachable replica) or 502, naming each replica that was not reset and why."""
    unknown = sorted(set(request.query_params) - set(RESET_QUERY))
    if unknown:
        raise InvalidArgument(f"/reset_prefix_cache takes the query parameters {', '.join(RESET_QUERY)}; got "
                              f"{', '.join(unknown)[:200]}")
    if reset_running_requests:
        raise InvalidArgument("reset_running_requests=true is not supported: running requests are not preempted; "
                              "they keep their blocks (the reset forgets every other cached prefix), so leave it "
                              "false or unset")
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


def _open_paths(app: FastAPI, options: HttpOptions) -> list[str]:
    """What stays open when a key is set, besides /health: metrics and the API docs, each when its flag says so."""
    paths = ["/metrics"] if options.open_metrics else []
    if options.open_docs:
        paths += [p for p in (app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url) if p]
    return paths


def build_app(link: EngineLink, options: HttpOptions, admission: Admission | None = None) -> FastAPI:
    """`admission`: shared with the gRPC face, so one set of caps covers both."""
    app = FastAPI(title="Splice", summary="OpenAI-compatible API (vLLM's format) of the Splice preprocessor")
    app.state.body_caps = lambda: _body_caps(link)
    install_error_handlers(app)
    if admission is not None:
        app.add_middleware(AdmissionMiddleware, admission=admission, idle=options.body_idle_timeout)
    if options.api_key:  # added last: outermost, so a request without the key is not even admitted
        app.add_middleware(KeyMiddleware, api_key=options.api_key, open_paths=_open_paths(app, options))
    api = APIRouter(route_class=OffLoopJsonRoute)  # (large bodies parsed off the loop: body.py)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @api.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        core, lora = await _served(link, options, body.model)
        decoded = await decode_chat(core, body, len(await request.body()))
        tools, sampling = decoded.tools, decoded.sampling
        conv = await fetch_remote_images(decoded.conv, options, core.limits.max_image_bytes)
        request_id = body.request_id or uuid.uuid4().hex
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        prepared = await until_disconnected(request, core.prepare_chat(conv, sampling, request_id, lora))
        shape = ChatShape(request_id, lora or served_names(options, core)[0],
                          _strings(core, options, body.return_tokens_as_token_ids), body.logprobs, include_usage,
                          prompt_ids=prepared.prompt_ids, return_ids=bool(body.return_token_ids), n=sampling.n,
                          listed=bool(sampling.logprob_token_ids), prompt_details=options.prompt_tokens_details,
                          role=convert.answer_role(body), echo=convert.echoed(body), tools=tools,
                          tool_parser=core.tool_parser)
        if not body.stream:
            _charge_whole_answer(core, prepared, shape, sampling)
        chunks = core.generate(prepared)
        if body.stream:
            return await stream_response(request, chunks, shape)
        return await whole_response(request, chunks, shape, prepared.choices)

    @api.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        core, lora = await _served(link, options, body.model)
        sampling, prompts = await decode_completion(body, len(await request.body()))
        request_id = body.request_id or uuid.uuid4().hex
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        prepared = await until_disconnected(request, core.prepare_complete(prompts, sampling, request_id,
                                                                           body.add_special_tokens, lora))
        shape = Shape(request_id, lora or served_names(options, core)[0],
                      _strings(core, options, body.return_tokens_as_token_ids), sampling.logprobs, include_usage,
                      prompt_ids=prepared.prompt_ids, return_ids=bool(body.return_token_ids), n=sampling.n,
                      listed=bool(sampling.logprob_token_ids), prompt_details=options.prompt_tokens_details,
                      echo_prompts=_echo_prompts(core, body, prompts) if body.echo else None,
                      echo_only=body.max_tokens == 0, shown=(body.logprobs or 0) + 1)
        if not body.stream:
            _charge_whole_answer(core, prepared, shape, sampling)
        chunks = core.generate(prepared)
        if body.stream:
            return await stream_response(request, chunks, shape)
        return await whole_response(request, chunks, shape, prepared.choices)

    @api.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request, reset_running_requests: bool = False,
                                 reset_external: bool = False) -> Response:
        """vLLM's: forgets every engine replica's cached prefixes. reset_external: there is no external
        (connector-held) prefix cache here, so true asks for nothing more."""
        return await _reset_prefix_cache(link, request, reset_running_requests)

    @api.get("/v1/models")
    async def models() -> dict:
        core = _core(link, options, None)
        created = int(time.time())
        with contextlib.suppress(SpliceError):  # (the engine unreachable now: the adapters it served last)
            await link.loras.refresh()
        names = served_names(options, core)
        return {"object": "list", "data": [*(_model_card(name, core.info.model, core.info.max_model_len, created)
                                             for name in names),
                                           *adapter_cards(link, names[0], created, _model_card)]}

    @api.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        core = _core(link, options, body.model)
        if isinstance(body, TokenizeChatRequest):
            conv = await asyncio.to_thread(conversation, core, body)
            conv = await fetch_remote_images(conv, options, core.limits.max_image_bytes)
            result = await core.tokenize_chat(conv)
        else:
            result = await asyncio.to_thread(core.tokenize_text, body.prompt, body.add_special_tokens)
        tokens = list(result.token_ids)
        # vLLM's: the vocabulary's pieces (a byte-level BPE's "Ġla"), not decoded text
        strs = await asyncio.to_thread(core.files.tokenizer.convert_ids_to_tokens, tokens) \
            if body.return_token_strs else None
        return {"count": len(tokens), "max_model_len": core.info.max_model_len, "tokens": tokens, "token_strs": strs}

    @api.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        core = _core(link, options, body.model)
        return {"prompt": await asyncio.to_thread(core.detokenize, body.tokens, True)}

    @app.get("/health")
    async def health() -> Response:
        if link.serving:
            return Response(status_code=200)
        return error_response(503, f"not serving: the engine at {link.target} is not reachable")

    @app.get("/version")
    async def version() -> dict:
        return {"version": SPLICE_VERSION}  # open, as vLLM's /version and /health

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(api)
    if options.allow_runtime_lora_updating:
        app.include_router(lora_routes(link))
    return app

