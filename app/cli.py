"""`splice` command line: engine, preprocessor, up, chat, demo, build-tiny.

The layer above the services: it resolves --model (built-in names, folders, HF ids from the HF cache or the
Hub) for them, so no service imports the tiny-model builder or the Hub client.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shlex
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from app import flags, lora_flags
from app.flags import REAL_DEFAULT
from app.tiny.names import DEFAULT_MODEL, TINY_NAMES
from splice.errors import SpliceError
from splice.flags import add_flags
from splice.ports import Listen, first_unbindable
from splice.security import API_KEY_ENV, ENGINE_KEY_ENV

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _service_resolver(service: str) -> Callable[[str], str]:
    """--model -> folder for a service process; building a tiny model or downloading an HF id is logged as that
    service's progress. The preprocessor fetches an HF id's config and tokenizer files only, never its weights."""
    from app.models import resolve_model

    log = logging.getLogger(f"splice.{service}")
    weights = service == "engine"
    return lambda name: resolve_model(name, progress=lambda m: log.info("%s", m), weights=weights)


def _check_model(name: str) -> None:
    """A --model that cannot be one, refused before a service imports its libraries (seconds) or fetches anything."""
    from app.models import check_model

    check_model(name)


def _build_tiny(args: argparse.Namespace) -> int:
    from app.tiny import ensure

    for name in args.names or sorted(TINY_NAMES):
        print(f"{name}: {ensure(name, progress=_say)}")
    return 0


def _up(args: argparse.Namespace) -> int:
    from app.models import model_note, resolve_model

    try:
        engine_args, preprocessor_args = _security_args(args)
    except ValueError as exc:
        _say(f"splice up: {exc}")
        return 2
    busy = first_unbindable([Listen("--port", args.host, args.port), Listen("--engine-port", args.engine_host,
                             args.engine_port), Listen("--http-port", args.host, args.http_port)])
    if busy:  # now, not after the engine loaded the model
        _say(f"splice up: {busy}")
        return 2
    try:  # build or download once here, with progress, before two processes load it (from the cache then)
        resolve_model(args.model, progress=_say)
    except SpliceError as exc:
        _say(f"splice up: {exc}")
        return 2
    if note := model_note(args.model):
        _say(note)
    from app.launch import StartFailed, start_stack
    from app.supervise import Supervisor

    echo = None if args.quiet else _say
    extra = preprocessor_flags(args)
    lora_engine, lora_pre = lora_flags.up_args(args)
    try:
        engine, pre = start_stack(args.model, host=args.host, engine_host=args.engine_host,
                                  engine_port=args.engine_port,
                                  preprocessor_port=args.port, http_port=args.http_port,
                                  engine_args=engine_args + lora_engine + shlex.split(args.engine_args),
                                  preprocessor_args=(preprocessor_args + extra + lora_pre
                                                     + shlex.split(args.preprocessor_args)),
                                  echo=echo)
    except StartFailed as exc:  # e.g. a busy port: the service's own one-line error, no traceback
        _say(f"splice up: {exc.name} did not start: {exc.reason}")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if pre.http_address:
        print(f"http serving on {pre.http_address}", flush=True)
    scheme = "https" if args.tls_cert else "http"
    http = f", OpenAI-compatible HTTP on {scheme}://{pre.http_address}/v1" if pre.http_address else ""
    secured = _secured(args)
    print(f"splice up: preprocessor (public API) on {pre.address}{http}, engine on {engine.address}"
          f"{f' ({secured})' if secured else ''}. Ctrl-C stops both.", flush=True)
    supervisor = Supervisor([engine, pre], _say, echo)
    try:
        supervisor.run(stop)
        return 0
    finally:
        engine, pre = supervisor.services
        pre.stop()
        engine.stop()


def preprocessor_flags(args: argparse.Namespace) -> list[str]:
    """`splice up`'s own flags that are the preprocessor's, as its arguments."""
    extra = ["--enable-mm-embeds"] if args.enable_mm_embeds else []
    extra += ["--tool-call-parser", args.tool_call_parser] if args.tool_call_parser else []
    extra += ["--enable-auto-tool-choice"] if args.enable_auto_tool_choice else []
    extra += ["--served-model-name", *args.served_model_name] if args.served_model_name else []
    return extra


def _security_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """`splice up`'s TLS and key flags as (engine flags, preprocessor flags); ValueError for a set that cannot
    work. Keys travel through the environment, not argv (other users can read a process's arguments), and
    restarted services inherit it.

    A public key without an engine key gets a generated one: an engine that answers without a key would let
    anyone who reaches its port past the public key."""
    if args.api_key:
        os.environ[API_KEY_ENV] = args.api_key
    if args.engine_api_key:
        os.environ[ENGINE_KEY_ENV] = args.engine_api_key
    elif os.environ.get(API_KEY_ENV) and not os.environ.get(ENGINE_KEY_ENV):
        os.environ[ENGINE_KEY_ENV] = secrets.token_urlsafe(32)
        args.engine_key_generated = True
    if args.engine_host not in LOOPBACK and not os.environ.get(ENGINE_KEY_ENV):
        _say(f"splice up: warning: the engine listens on {args.engine_host} without a key (--engine-api-key): "
             f"anyone who reaches its port can generate")
    pre = ["--allowed-media-domains", *args.allowed_media_domains] if args.allowed_media_domains else []
    pre += _flags(("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-ca", args.tls_ca))
    if (args.engine_server_cert is None) != (args.engine_server_key is None):
        raise ValueError("the engine's TLS needs both --engine-server-cert and --engine-server-key")
    if args.engine_server_cert and not args.engine_tls_ca:
        raise ValueError("--engine-server-cert needs --engine-tls-ca, the CA the preprocessor trusts for it "
                         "('system': the system's roots)")
    if args.engine_tls_ca and not args.engine_server_cert:
        raise ValueError("--engine-tls-ca needs --engine-server-cert and --engine-server-key: the engine serves "
                         "TLS with them")
    if (args.engine_tls_cert is None) != (args.engine_tls_key is None):
        raise ValueError("the preprocessor's certificate needs both --engine-tls-cert and --engine-tls-key")
    if args.engine_tls_cert and args.engine_tls_ca == "system":
        raise ValueError("mTLS on the engine link needs a CA file as --engine-tls-ca (the engine checks the "
                         "preprocessor's certificate against it), not 'system'")
    engine = _flags(("--tls-cert", args.engine_server_cert), ("--tls-key", args.engine_server_key),
                    # a preprocessor certificate given: the engine requires one, signed by the link's CA
                    ("--tls-ca", args.engine_tls_ca if args.engine_tls_cert else None))
    pre += _flags(("--engine-tls-ca", args.engine_tls_ca), ("--engine-tls-cert", args.engine_tls_cert),
                  ("--engine-tls-key", args.engine_tls_key))
    return engine, pre


def _flags(*pairs: tuple[str, str | None]) -> list[str]:
    return [item for flag, value in pairs if value is not None for item in (flag, value)]


def _secured(args: argparse.Namespace) -> str:
    """What `splice up` secured, for its ready line."""
    public = ("mTLS" if args.tls_ca else "TLS") if args.tls_cert else ""
    link = ("mTLS" if args.engine_tls_cert else "TLS") if args.engine_server_cert else ""
    engine_key = "engine key (generated)" if args.engine_key_generated else "engine key"
    parts = [f"public API {public}" if public else "", "public API key" if os.environ.get(API_KEY_ENV) else "",
             f"engine link {link}" if link else "", engine_key if os.environ.get(ENGINE_KEY_ENV) else ""]
    return ", ".join(p for p in parts if p)


# `splice chat` flags that map one-to-one onto SamplingParams fields (given = sent; the server checks the values)
CHAT_CONTROLS = ("seed", "top_p", "top_k", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
                 "min_tokens", "top_logprobs", "prompt_logprobs", "n", "cache_salt")
# ... and onto ChatRequest fields
CHAT_FIELDS = ("chat_template_kwargs", "documents", "reasoning_effort", "mm_processor_kwargs", "tools",
               "tool_choice", "parallel_tool_calls", "lora")


def chat_sampling(args: argparse.Namespace) -> dict:
    """`splice chat`'s flags -> the client's sampling keywords."""
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    sampling.update({name: getattr(args, name) for name in CHAT_CONTROLS if getattr(args, name) is not None})
    if args.logit_bias:
        sampling["logit_bias"] = dict(args.logit_bias)
    for name in ("bad_words", "stop"):
        if getattr(args, name):
            sampling[name] = tuple(getattr(args, name))
    for name in ("allowed_token_ids", "stop_token_ids", "logprob_token_ids"):
        if getattr(args, name):
            sampling[name] = getattr(args, name)
    for name in ("include_stop_str_in_output", "ignore_eos"):
        if getattr(args, name):
            sampling[name] = True
    for name in ("structured_outputs", "response_format"):
        if getattr(args, name) is not None:
            sampling[name] = getattr(args, name)
    if args.logprobs or args.top_logprobs or args.logprob_token_ids:
        sampling["logprobs"] = True
    if not args.skip_special_tokens:
        sampling["skip_special_tokens"] = False
    return sampling


def chat_fields(args: argparse.Namespace) -> dict:
    """`splice chat`'s flags -> the client's ChatRequest keywords (vLLM's chat fields)."""
    fields = {name: getattr(args, name) for name in CHAT_FIELDS if getattr(args, name) is not None}
    if args.continue_final_message:  # the answer continues the last message instead of starting its own
        fields.update(continue_final_message=True, add_generation_prompt=False)
    if args.add_special_tokens:
        fields["add_special_tokens"] = True
    return fields


def print_tool_calls(chunks: list) -> None:
    """A chat with tools: each call found, `name(arguments)`, its pieces joined by index."""
    calls: dict[int, list[str]] = {}
    for piece in (p for c in chunks for p in c.tool_calls):
        call = calls.setdefault(piece.index, ["", ""])
        call[0] += piece.name
        call[1] += piece.arguments
    for name, arguments in calls.values():
        print(f"tool call: {name}({arguments})", flush=True)


def print_logprobs(chunks: list) -> None:
    """--logprobs: each generated token's ID, text and log-probability, then its --top-logprobs alternatives; with
    --n, choice by choice."""
    several, shown = any(c.index for c in chunks), None
    for chunk in sorted(chunks, key=lambda c: c.index):  # (stable: each choice's tokens in order)
        if several and chunk.index != shown:
            shown = chunk.index
            _say(f"--- choice {shown}")
        text = f" {chunk.text!r}" if len(chunk.token_ids) == 1 else ""
        for i, (token, logprob) in enumerate(zip(chunk.token_ids, chunk.logprobs, strict=False)):
            top = chunk.top_logprobs[i] if i < len(chunk.top_logprobs) else ()
            alternatives = "  top: " + ", ".join(f"{t}:{lp:.4f}" for t, lp in top) if top else ""
            _say(f"token {token}{text} logprob={logprob:.4f}{alternatives}")


def print_prompt_logprobs(chunks: list) -> None:
    """--prompt-logprobs: each prompt token's ID, log-probability and rank (none for the first), then its
    alternatives."""
    plp = next((c.prompt_logprobs for c in chunks if c.prompt_logprobs is not None), None)
    for entry in plp.entries() if plp is not None else ():
        if entry is None:
            _say(f"prompt token {plp.token_ids[0]} (first: no logprob)")
            continue
        token, logprob, rank, top = entry
        alternatives = "  top: " + ", ".join(f"{t}:{lp:.4f}" for t, lp in top) if top else ""
        _say(f"prompt token {token} logprob={logprob:.4f} rank={rank}{alternatives}")


def _chat(args: argparse.Namespace) -> int:
    content: list = []
    for path in args.embeds or []:  # local files first, before any connection: one line each, exit 2
        part = _embeds_part(path)
        if isinstance(part, str):
            _say(part)
            return 2
        content.append(part)
    for path in args.image or []:
        try:
            content.append({"type": "image", "image": Path(path).read_bytes()})
        except OSError as exc:
            _say(f"{path}: cannot read image ({exc.strerror or exc})")
            return 2
    content.append({"type": "text", "text": args.prompt})
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": content}]
    if args.assistant is not None:
        messages.append({"role": "assistant", "content": args.assistant})
    if not _listening(args.target):  # now: the client's imports (torch) would make this line wait seconds
        _say(f"no Splice server at {args.target}: start one with 'splice up' (or pass --target)")
        return 2
    sampling = chat_sampling(args)
    fields = chat_fields(args)
    from clients import SpliceClient, SpliceClientError
    from splice.security import ClientTLS

    try:
        tls = ClientTLS(args.tls_ca, args.tls_cert, args.tls_key) if args.tls or args.tls_ca or args.tls_cert else None
        api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
        with SpliceClient(args.target, timeout=args.timeout, tls=tls, api_key=api_key) as client:
            usages, finishes = {}, {}  # by choice
            choices: dict[int, list[str]] = {}  # n > 1: each choice printed whole once all have ended
            chunks = []
            for chunk in client.chat(messages, **fields, **sampling):
                if (args.n or 1) > 1:
                    choices.setdefault(chunk.index, []).append(chunk.text)
                else:
                    print(chunk.text, end="", flush=True)
                if chunk.usage:
                    usages[chunk.index], finishes[chunk.index] = chunk.usage, chunk.finish_reason
                chunks.append(chunk)
            for i in sorted(choices):
                print(f"--- choice {i}")
                print("".join(choices[i]), end="")
            print()
            print_tool_calls(chunks)
            if sampling.get("prompt_logprobs") is not None:
                print_prompt_logprobs(chunks)
            if sampling.get("logprobs"):
                print_logprobs(chunks)
    except SpliceClientError as err:
        if err.code == grpc.StatusCode.UNAVAILABLE and not _listening(args.target):
            _say(f"no Splice server at {args.target}: start one with 'splice up' (or pass --target)")
            return 2
        _say(f"error: {err}")
        return 1
    except ValueError as err:
        _say(f"error: {err}")
        return 1
    if usages:  # the prompt counted once, the choices' tokens summed (as the HTTP API's usage)
        finish = ",".join(str(finishes[i]) for i in sorted(finishes))
        _say(f"finish_reason={finish} prompt_tokens={usages[min(usages)].prompt_tokens} "
             f"completion_tokens={sum(u.completion_tokens for u in usages.values())}")
    return 0


def _embeds_part(path: str) -> dict | str:
    """--embeds FILE as a content part, or the one line saying why not (the same form as an unreadable image)."""
    from safetensors.torch import load_file

    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        return f"{path}: cannot read prompt embeddings ({exc.strerror or exc})"
    try:
        tensors = load_file(path)
    except Exception as exc:  # unreadable, not safetensors: one line, not a traceback
        return f"{path}: cannot load prompt embeddings ({type(exc).__name__}: {exc})"
    if len(tensors) != 1:
        return f"{path}: expected exactly one tensor, found {sorted(tensors)}"
    return {"type": "prompt_embeds", "prompt_embeds": next(iter(tensors.values()))}


def _listening(target: str) -> bool:
    """Whether anything accepts TCP connections at a HOST:PORT target (True where the target is not one: a
    dns:/// or unix: target's failure is reported as the server's)."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return True
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5):
            return True
    except OSError:
        return False


def _demo(args: argparse.Namespace) -> int:
    from app.demo import run_demo
    from app.models import resolve_model

    try:
        resolve_model(args.model, progress=_say)
    except SpliceError as exc:
        _say(f"splice demo: {exc}")
        return 2
    return run_demo(args.model, max_tokens=args.max_tokens, real_model=args.real_model or None)


def build_parser() -> argparse.ArgumentParser:
    """The commands, each with its flags' tables (app/flags.py; the services': engine/cli.py, preprocessor/cli.py)."""
    parser = argparse.ArgumentParser(prog="splice", description="Serve chat models with text, images and "
                                     "caller-supplied prompt embeddings.")
    parser.add_argument("--version", action="version", version=f"splice {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    from engine import cli as engine_cli
    from preprocessor import cli as preprocessor_cli

    p = sub.add_parser("engine", help="serve splice.v1.Engine (model on GPU/CPU)")
    engine_cli.add_arguments(p)
    p.set_defaults(model=DEFAULT_MODEL, func=lambda a: engine_cli.run(a, _service_resolver("engine"), _check_model))

    p = sub.add_parser("preprocessor", help="serve splice.v1.Preprocessor (public API, CPU)")
    preprocessor_cli.add_arguments(p)
    p.set_defaults(func=lambda a: preprocessor_cli.run(a, _service_resolver("preprocessor"), _check_model))

    p = sub.add_parser("up", help="start engine + preprocessor locally, restarting either if it crashes; "
                       "Ctrl-C stops both")
    add_flags(p, flags.UP_ADDRESSES, flags.UP_SECURITY, flags.UP_SERVING, flags.UP_PASSED_ON)
    lora_flags.add_up_arguments(p)
    add_flags(p, flags.UP_OUTPUT)
    p.set_defaults(func=_up, engine_key_generated=False)

    p = sub.add_parser("chat", help="send one conversation to a preprocessor and stream the answer")
    add_flags(p, flags.CHAT_MESSAGES, flags.CHAT_SAMPLING, flags.CHAT_LOGPROBS, flags.CHAT_CONSTRAINTS,
              flags.CHAT_FIELDS, flags.CHAT_CONNECTION)
    p.set_defaults(func=_chat)

    p = sub.add_parser("build-tiny", help="build (and train, for the default) the tiny built-in models into the cache")
    add_flags(p, flags.BUILD_TINY)
    p.set_defaults(func=_build_tiny)

    p = sub.add_parser("demo", help=f"a conversation of text, prompt embeddings, an image and text on "
                       f"{DEFAULT_MODEL}, then a question to the real model {REAL_DEFAULT}")
    add_flags(p, flags.DEMO)
    p.set_defaults(func=_demo)
    for command in sub.choices.values():
        state_defaults(command)
    return parser


def state_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option's --help states its default once: appended where a value is the default and the help does
    not already say it (in words, e.g. "default: $SPLICE_API_KEY", or as %(default)s); an option whose default is
    "not given" (None, False, empty) says nothing rather than "(default: None)"."""
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        unset = action.default is None or action.default is False or action.default in ("", [], argparse.SUPPRESS)
        if unset or "default" in (action.help or ""):
            continue
        action.help = f"{action.help} (default: %(default)s)" if action.help else "default: %(default)s"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("splice")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _quiet_libraries() -> None:
    """For the commands that build or load a model in this process (up, demo, build-tiny): the training's own
    progress lines (logger splice.tiny) shown, transformers' bars ("Writing model shards", "Loading weights")
    and notices not; huggingface_hub's download bars stay, a real download's only progress."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    tiny = logging.getLogger("splice.tiny")
    tiny.addHandler(handler)
    tiny.setLevel(logging.INFO)
    tiny.propagate = False
    if "TRANSFORMERS_VERBOSITY" in os.environ:  # the user asked for transformers' output
        return
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as hf_logging

    hub_bars = not are_progress_bars_disabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # this turns huggingface_hub's off too
    if hub_bars:
        enable_progress_bars()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("up", "demo", "build-tiny"):
        _quiet_libraries()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C while a model builds, trains or downloads: a half-built one is discarded
        _say(f"splice {args.command}: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
