"""`splice preprocessor` arguments and entry point."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from preprocessor.admission import Admission
from preprocessor.http.options import HttpOptions
from preprocessor.limits import Limits
from preprocessor.tools.parsers import parser_names
from splice import heap
from splice.drain import DEFAULT_GRACE
from splice.flags import Flag, add_flags, flag, json_flag
from splice.ports import Listen, first_unbindable
from splice.security import API_KEY_ENV, ENGINE_KEY_ENV, ClientTLS, Security, server_tls
from splice.service_main import CheckModel, Resolve, model_refused, run_service

DEFAULTS = Limits()
log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags in the groups of docs/operations.md's configuration table."""
    add_flags(parser, _engine_link(), _public_api(), _http_face(), _admission(), _request_limits(), _templates(),
              _answers(), _service())


def _engine_link() -> tuple[Flag, ...]:
    """Which engine, and how it is reached."""
    return (
        flag("--engine", default="127.0.0.1:50061", help="HOST:PORT of splice.v1.Engine"),
        flag("--model", default=None, help="tokenizer/processor source (built-in name, folder or HF id: its config and "
                                           "tokenizer files only are downloaded); default: the model the engine "
                                           "reports"),
        flag("--poll-interval", type=float, default=2.0, help="seconds between engine checks"),
        flag("--engine-tls-ca", default=None,
             help="reach the engine over TLS, trusting this PEM CA ('system': the system's roots)"),
        flag("--engine-tls-cert", default=None,
             help="client certificate to present to the engine (mTLS; with --engine-tls-key)"),
        flag("--engine-tls-key", default=None, help="PEM private key of --engine-tls-cert"),
        flag("--engine-api-key", default=None, help="the key the engine requires (default: $SPLICE_ENGINE_API_KEY)"),
        flag("--engine-multiplex", action=argparse.BooleanOptionalAction, default=True,
             help="requests that fit in one message share one Multiplex stream to the engine, which answers with one "
                  "message per step for all of them; a dns:, ipv4: or ipv6: --engine (replicas) keeps one call per "
                  "request, balanced by gRPC (default: %(default)s)"),
    )


def _public_api() -> tuple[Flag, ...]:
    """Who may call the public API (gRPC and HTTP)."""
    return (
        flag("--api-key", default=None,
             help="require 'authorization: Bearer KEY' on the public API, gRPC metadata and HTTP header alike "
                  "(default: $SPLICE_API_KEY); health stays open, HTTP /metrics and the API docs (HTTP /docs, /redoc, "
                  "/openapi.json; gRPC reflection) need the key unless opened"),
        flag("--open-metrics", action="store_true",
             help="with --api-key: serve the HTTP face's /metrics without the key (default: off)"),
        flag("--open-docs", action="store_true",
             help="with --api-key: serve /docs, /redoc, /openapi.json and gRPC reflection without the key "
                  "(default: off)"),
    )


def _http_face() -> tuple[Flag, ...]:
    """The OpenAI-compatible HTTP API: its port, remote media, connection guards."""
    return (
        flag("--http-port", type=int, default=None,
             help="also serve the OpenAI-compatible HTTP API on --host at this port (0: a free one); default off"),
        flag("--allowed-media-domains", nargs="*", default=[], metavar="HOST[:PORT]",
             help="hosts and ports whose http(s) image URLs the HTTP API may fetch: HOST:PORT that port only, a bare "
                  "HOST ports 80 and 443 only (default: none)"),
        flag("--media-fetch-timeout", type=float, default=HttpOptions.media_timeout,
             help="seconds to fetch one remote image"),
        flag("--http-header-timeout", type=float, default=HttpOptions.header_timeout,
             help="seconds an HTTP connection has to send a request's headers (from opening, or from the first byte "
                  "of its next request) before it is closed (default: %(default)s)"),
        flag("--http-max-connections", type=int, default=HttpOptions.max_connections,
             help="HTTP connections open at once; one more is answered 503 and closed (default: %(default)s)"),
        flag("--http-send-buffer-kb", type=int, default=HttpOptions.send_buffer_kb,
             help="KiB of answer the kernel buffers for each HTTP connection (SO_SNDBUF, which Linux doubles and "
                  "caps at net.core.wmem_max): what a client that does not read holds before its stream pauses; 0: "
                  "the kernel's own tuning, up to net.ipv4.tcp_wmem's maximum (default: %(default)s)"),
    )


def _admission() -> tuple[Flag, ...]:
    """What the requests in progress may hold together (docs/operations.md: the admission rule)."""
    return (
        flag("--max-concurrent-requests", type=int, default=256,
             help="requests (gRPC and HTTP) worked on at once; beyond it RESOURCE_EXHAUSTED / 429"),
        flag("--max-inflight-request-bytes", type=int, default=1 << 30,
             help="request bytes held at once across requests; beyond it RESOURCE_EXHAUSTED / 429, decided from the "
                  "message size (gRPC) or Content-Length (HTTP) before parsing, a chunked HTTP body counted as it "
                  "arrives; one HTTP body larger than this: 413"),
        flag("--upload-idle-timeout", type=float, default=DEFAULTS.upload_idle_timeout,
             help="seconds an Upload stream (gRPC) or a request body (HTTP: 408) may stay silent before "
                  "DEADLINE_EXCEEDED (it then releases its admission)"),
    )


def _request_limits() -> tuple[Flag, ...]:
    """What one request may carry: images, embeddings, prompts."""
    return (
        flag("--allowed-media-dir", type=Path, default=None,
             help="allow image paths under this directory (off by default)"),
        flag("--max-images", type=int, default=DEFAULTS.max_images),
        flag("--max-image-bytes", type=int, default=DEFAULTS.max_image_bytes),
        flag("--max-image-pixels", type=int, default=DEFAULTS.max_image_pixels,
             help="width x height of one image, from its header before decoding (default: %(default)s)"),
        flag("--max-image-side", type=int, default=DEFAULTS.max_image_side,
             help="width and height of one image each, from its header (default: %(default)s)"),
        flag("--max-image-aspect-ratio", type=float, default=DEFAULTS.max_image_aspect_ratio,
             help="longer side / shorter side of one image, from its header (default: %(default)g)"),
        flag("--max-request-image-pixels", type=int, default=DEFAULTS.max_request_image_pixels,
             help="pixels of a request's images together, from their headers; what decoding them holds counts in "
                  "--max-inflight-request-bytes (default: %(default)s = 4 x 4096 x 4096)"),
        flag("--max-embeds-parts", type=int, default=DEFAULTS.max_embeds_parts),
        flag("--max-embeds-bytes", type=int, default=DEFAULTS.max_embeds_bytes),
        flag("--enable-mm-embeds", action="store_true",
             help="accept image_embeds content parts: precomputed image features merged in place of a picture's "
                  "(vLLM's flag; off: FAILED_PRECONDITION, HTTP 400)"),
        flag("--max-prompts", type=int, default=DEFAULTS.max_prompts,
             help="prompts in one /v1/completions request (each is its own engine request)"),
    )


def _templates() -> tuple[Flag, ...]:
    """Chat templates sent with requests."""
    return (
        flag("--trust-request-chat-template", action="store_true",
             help="accept chat_template in requests (off: FAILED_PRECONDITION); they render in worker processes "
                  "killed after --chat-template-timeout"),
        flag("--chat-template-timeout", type=float, default=DEFAULTS.chat_template_timeout,
             help="seconds a request's chat template may take to render, queueing included"),
        flag("--chat-template-workers", type=int, default=DEFAULTS.chat_template_workers,
             help="worker processes rendering request chat templates (one more waits started, to replace a worker "
                  "killed for overrunning at once)"),
    )


def _answers() -> tuple[Flag, ...]:
    """vLLM's serving flags: tool calls, the names served, LoRA updates, what answers show."""
    return (
        flag("--tool-call-parser", choices=parser_names(), default=None,
             help="how calls are read from an answer to a request with tools (vLLM's parsers)"),
        flag("--enable-auto-tool-choice", action="store_true",
             help='serve tool_choice "auto" (the default with tools): the model decides, the parser finds its '
                  "calls; needs --tool-call-parser"),
        flag("--allow-runtime-lora-updating", action="store_true",
             default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
             help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's switch, also "
                  "$VLLM_ALLOW_RUNTIME_LORA_UPDATING), which load a PEFT folder on every engine replica (started "
                  "with --enable-lora); they need --api-key's key like every route (default: off)"),
        flag("--served-model-name", nargs="+", default=None, metavar="NAME",
             help="the names the HTTP API serves the model as (vLLM's): /v1/models lists them, a request's model "
                  "may be any of them, answers carry the first (default: the model's own name)"),
        flag("--return-tokens-as-token-ids", action="store_true",
             help="logprobs name tokens 'token_id:N' unless a request's return_tokens_as_token_ids says otherwise "
                  "(vLLM's flag)"),
        flag("--enable-prompt-tokens-details", action="store_true",
             help="usage.prompt_tokens_details.cached_tokens: the prompt tokens read from the engine's prefix cache "
                  "(vLLM's flag; off: null)"),
        flag("--structured-outputs-config", type=structured_outputs_config, default=None, metavar="JSON",
             help="""vLLM's: '{"disable_any_whitespace": true}' writes JSON (structured outputs, tool calls) """
                  """without whitespace between tokens; also --structured-outputs-config.disable_any_whitespace """
                  """true"""),
        flag("--structured-outputs-config.disable_any_whitespace", dest="disable_any_whitespace", type=_bool,
             default=None, metavar="BOOL", help=argparse.SUPPRESS),
    )


def _service() -> tuple[Flag, ...]:
    """What every service takes: where it listens, TLS, drain, metrics, logs."""
    return (
        flag("--host", default="127.0.0.1", help="listen address (0.0.0.0: all interfaces)"),
        flag("--port", type=int, default=50051, help="0 picks a free port"),
        flag("--tls-cert", default=None, help="PEM certificate: serve TLS, gRPC and HTTP (with --tls-key)"),
        flag("--tls-key", default=None, help="PEM private key of --tls-cert"),
        flag("--tls-ca", default=None, help="PEM CA: require client certificates signed by it (mTLS)"),
        flag("--drain-grace", type=float, default=DEFAULT_GRACE,
             help="on SIGTERM: seconds running requests get to finish (health NOT_SERVING and new requests "
                  "UNAVAILABLE meanwhile)"),
        flag("--metrics-port", type=int, default=None,
             help="serve Prometheus /metrics on --host at this port (0: a free one); default off"),
        flag("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR"),
    )


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


# vLLM's --structured-outputs-config keys that mean something here (xgrammar is the one backend)
STRUCTURED_CONFIG = {"disable_any_whitespace": (True, False), "backend": ("xgrammar", "auto")}


def structured_outputs_config(text: str) -> dict:
    config = json_flag(dict)(text)
    for key, value in config.items():
        if key not in STRUCTURED_CONFIG or value not in STRUCTURED_CONFIG[key]:
            raise argparse.ArgumentTypeError(f"{key}={value!r} is not supported; the keys are "
                                             f"disable_any_whitespace (true or false) and backend (xgrammar)")
    return config


def _disable_any_whitespace(args: argparse.Namespace) -> bool:
    if args.disable_any_whitespace is not None:
        return args.disable_any_whitespace
    return bool((args.structured_outputs_config or {}).get("disable_any_whitespace", False))


def limits_from_args(args: argparse.Namespace) -> Limits:
    return Limits(max_image_bytes=args.max_image_bytes, max_image_pixels=args.max_image_pixels,
                  max_image_side=args.max_image_side, max_image_aspect_ratio=args.max_image_aspect_ratio,
                  max_images=args.max_images, max_request_image_pixels=args.max_request_image_pixels,
                  max_embeds_bytes=args.max_embeds_bytes, max_embeds_parts=args.max_embeds_parts,
                  max_prompts=args.max_prompts, allowed_media_dir=args.allowed_media_dir,
                  trust_request_chat_template=args.trust_request_chat_template,
                  chat_template_timeout=args.chat_template_timeout, chat_template_workers=args.chat_template_workers,
                  upload_idle_timeout=args.upload_idle_timeout, enable_mm_embeds=args.enable_mm_embeds,
                  tool_call_parser=args.tool_call_parser, enable_auto_tool_choice=args.enable_auto_tool_choice,
                  disable_any_whitespace=_disable_any_whitespace(args))


def admission_from_args(args: argparse.Namespace) -> Admission:
    return Admission(args.max_concurrent_requests, args.max_inflight_request_bytes)


def security_from_args(args: argparse.Namespace) -> Security:
    engine_tls = None
    if args.engine_tls_ca or args.engine_tls_cert or args.engine_tls_key:
        ca = None if args.engine_tls_ca in (None, "system") else args.engine_tls_ca
        engine_tls = ClientTLS(ca, args.engine_tls_cert, args.engine_tls_key)
    return Security(tls=server_tls(args.tls_cert, args.tls_key, args.tls_ca), api_key=_api_key(args),
                    open_docs=args.open_docs,
                    engine_tls=engine_tls, engine_api_key=args.engine_api_key or os.environ.get(ENGINE_KEY_ENV) or None)


def _api_key(args: argparse.Namespace) -> str | None:
    return args.api_key or os.environ.get(API_KEY_ENV) or None


def http_from_args(args: argparse.Namespace) -> HttpOptions | None:
    if args.http_port is None:
        return None
    return HttpOptions(port=args.http_port, api_key=_api_key(args), open_metrics=args.open_metrics,
                       open_docs=args.open_docs,
                       allowed_media_domains=tuple(args.allowed_media_domains), media_timeout=args.media_fetch_timeout,
                       drain_grace=args.drain_grace, header_timeout=args.http_header_timeout,
                       body_idle_timeout=args.upload_idle_timeout,
                       max_connections=args.http_max_connections, send_buffer_kb=args.http_send_buffer_kb,
                       allow_runtime_lora_updating=args.allow_runtime_lora_updating,
                       served_model_names=tuple(args.served_model_name or ()),
                       return_tokens_as_token_ids=args.return_tokens_as_token_ids,
                       prompt_tokens_details=args.enable_prompt_tokens_details)


async def serve(args: argparse.Namespace, resolve: Resolve) -> None:
    from preprocessor.server import PreprocessorServer
    from splice.metrics import start_exporter

    if args.metrics_port is not None:  # first: the metrics line precedes the ready line
        exporter = start_exporter(args.host, args.metrics_port)
        print(f"preprocessor metrics on {exporter.address}", flush=True)
    model = args.model
    if model is not None:  # now: a model that cannot be had is one line and exit 2, not a retry per engine poll
        model = await asyncio.to_thread(resolve, model)
    server = PreprocessorServer(engine=args.engine, model=model, host=args.host, port=args.port,
                                limits=limits_from_args(args), poll_interval=args.poll_interval,
                                resolve=resolve, http=http_from_args(args), admission=admission_from_args(args),
                                security=security_from_args(args), engine_multiplex=args.engine_multiplex)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    port = await server.start()
    http = f", HTTP on {args.host}:{server.http_port}" if server.http_port is not None else ""
    # at once: the ready lines wait for the engine, which may take minutes to load or not be started yet
    log.info("listening on %s:%d (gRPC)%s; NOT_SERVING until the engine at %s answers", args.host, port, http,
             args.engine)
    try:
        ready = asyncio.create_task(server.ready.wait())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            if server.http_port is not None:  # before the ready line: the launcher reads both by then
                print(f"http serving on {args.host}:{server.http_port}", flush=True)
            print(f"preprocessor serving on {args.host}:{port}", flush=True)
            await stopped
        ready.cancel()
    finally:
        await server.stop(args.drain_grace)


def run(args: argparse.Namespace, resolve: Resolve, check: CheckModel | None = None) -> int:
    try:
        limits_from_args(args)
        http_from_args(args)
        admission_from_args(args)
        security_from_args(args)
    except ValueError as exc:
        print(f"splice preprocessor: {exc}", file=sys.stderr)
        return 2
    busy = first_unbindable([Listen("--port", args.host, args.port),
                             Listen("--http-port", args.host, args.http_port or 0),
                             Listen("--metrics-port", args.host, args.metrics_port or 0)])
    if busy:  # before the model loads
        print(f"splice preprocessor: {busy}", file=sys.stderr)
        return 2
    if model_refused("preprocessor", args.model, check):
        return 2
    # a large body or answer's blocks go back to the OS when freed (the engine keeps glibc's default, which serves its
    # per-step tensors from the heap without a mapping each)
    heap.keep_large_blocks_mapped()
    return run_service("preprocessor", serve(args, resolve), args.log_level)
