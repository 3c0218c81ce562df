"""`splice engine` arguments and entry point."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING

from engine.scheduler import DEFAULT_MIXED_PREFILL_TOKENS, GPU_MIXED_PREFILL_TOKENS
from splice import heap
from splice.drain import DEFAULT_GRACE
from splice.lora_modules import parse_lora_modules
from splice.ports import Listen, first_unbindable
from splice.sampling import DEFAULT_STRUCTURED_CACHE_MB, DEFAULT_STRUCTURED_COMPILE_TIMEOUT_S
from splice.security import ENGINE_KEY_ENV, server_tls
from splice.service_main import CheckModel, Resolve, model_refused, run_service

if TYPE_CHECKING:
    from engine.config import EngineConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="built-in model name, local HF folder, or HF id (ORG/NAME: from the Hugging Face cache, "
                             "downloaded from the Hub when not there)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (0.0.0.0: all interfaces)")
    parser.add_argument("--port", type=int, default=50061, help="0 picks a free port (printed when ready)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"],
                        help="auto: the checkpoint's dtype on cuda, float32 on cpu")
    parser.add_argument("--max-model-len", type=int, default=None, help="default: the config's max_position_embeddings")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="ranks that each hold a shard of the model (transformers' tensor-parallel plan; gloo "
                             "on CPU, NCCL on GPU: one GPU per rank)")
    parser.add_argument("--max-running-seqs", type=int, default=64, help="sequences decoded together per step")
    parser.add_argument("--max-seqs-per-request", type=int, default=None,
                        help="sequences one request may hold (its n choices, which run together); a request of more "
                             "is refused (INVALID_ARGUMENT / HTTP 400). Default: --max-running-seqs")
    parser.add_argument("--max-batch-tokens", type=int, default=None,
                        help="positions one forward may process; default max(8192, max model len)")
    parser.add_argument("--mixed-prefill-tokens", type=int, default=None,
                        help="while sequences decode, prompt positions a step may prefill (a longer prompt is "
                             "prefilled over several steps): smaller keeps inter-token latency flat under arrivals "
                             f"(default: {DEFAULT_MIXED_PREFILL_TOKENS} on CPU; {GPU_MIXED_PREFILL_TOKENS} on a GPU "
                             "and with --simulate-forward-ms)")
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="send each stream's tokens every N tokens (its first token and its end at once): "
                             "fewer, larger messages for more throughput, burstier streams")
    parser.add_argument("--max-unread-tokens", type=int, default=256,
                        help="a request whose reader is this many tokens behind what was sent to it is paused: its "
                             "sequences keep their slots but are not decoded until the reader catches up (0: never)")
    parser.add_argument("--unread-timeout", type=float, default=60.0,
                        help="seconds a paused request may wait for its reader; then it is cancelled "
                             "(DEADLINE_EXCEEDED) and its slots go to readers that read")
    parser.add_argument("--model-impl", default="auto", choices=["auto", "splice", "transformers"],
                        help="what runs the text stack: auto = Splice's own forward where the architecture has one "
                             "(Llama, Qwen2 text stacks), else transformers' modules; splice = Splice's or fail; "
                             "transformers = always transformers' modules")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch's intra-op threads (per tensor-parallel rank); default: $OMP_NUM_THREADS when "
                             "set, else this host's CPUs less one (shared by the ranks), leaving a core to the "
                             "serving loop and a co-located preprocessor")
    parser.add_argument("--compute-threads", type=int, default=None,
                        help="torch's intra-op threads on the CPU for the matrix products of every step and for "
                             "all of a step that prefills 64 prompt positions or more (products scale with the "
                             "cores; a decode step's small ops do not); default: every CPU of this host where "
                             "--torch-threads and $OMP_NUM_THREADS are unset and tensor parallelism is off, else "
                             "--torch-threads")
    parser.add_argument("--encoder-cache-mb", type=int, default=512,
                        help="MiB of vision-tower outputs kept by picture content, so a picture sent again (as "
                             "multi-turn chats do) is not encoded again; least recently used evicted first; 0: off "
                             "(default: 512)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="keep the key/value columns of whole blocks of prompt positions by content (token IDs, "
                             "pictures, prompt-embeds rows, cache_salt), so a prompt that begins with a cached prefix "
                             "prefills only the rest; off for tensor parallelism and the hybrid recurrent families "
                             "(default: %(default)s)")
    parser.add_argument("--block-size", type=int, default=16,
                        help="prompt positions per prefix-cache block: a hit covers whole blocks (default: 16)")
    parser.add_argument("--prefix-cache-mb", type=int, default=1024,
                        help="MiB of key/value blocks the prefix cache keeps, least recently used evicted first; "
                             "reserved lazily on the CPU (default: 1024)")
    parser.add_argument("--structured-compile-timeout", type=float, default=DEFAULT_STRUCTURED_COMPILE_TIMEOUT_S,
                        help="seconds a structured output's grammar (response_format, structured_outputs) may take "
                             "to compile for the tokenizer before the request is refused with INVALID_ARGUMENT; "
                             "compiles run off the step thread, once per distinct spec, fairly across requests; "
                             "the time counts from a compile's own start (default: %(default)s)")
    parser.add_argument("--structured-cache-mb", type=int, default=DEFAULT_STRUCTURED_CACHE_MB,
                        help="MiB of compiled grammars (token masks) kept, least recently used evicted first; a "
                             "grammar that compiles larger is refused with INVALID_ARGUMENT (default: %(default)s)")
    parser.add_argument("--simulate-forward-ms", type=float, default=None, metavar="MS",
                        help="a benchmarking aid, not for serving: the model's forward (and vision tower) is replaced "
                             "by a wait of MS milliseconds per step that holds no CPU, as a GPU kernel would (MS more "
                             "per 512 prompt positions), with deterministic logits, so the scheduler, sampler and both "
                             "gRPC hops are measured at GPU speed on any machine; weights are still loaded "
                             "(default: off)")
    lora = parser.add_argument_group("LoRA adapters (vLLM's flags)")
    lora.add_argument("--enable-lora", action="store_true",
                      help="serve LoRA adapters in PEFT's format, picked per request by name (a request's `model`)")
    lora.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                      help="adapters served from the start: NAME=PATH or vLLM's JSON {\"name\": ..., \"path\": ...}; "
                           "PATH a PEFT folder or a built-in adapter's name (e.g. tiny-text-lora)")
    lora.add_argument("--max-loras", type=int, default=1,
                      help="distinct adapters one step's batch may hold; requests under another wait (default: 1)")
    lora.add_argument("--max-lora-rank", type=int, default=16,
                      help="an adapter of a larger rank is refused at load (default: 16)")
    lora.add_argument("--max-cpu-loras", type=int, default=None,
                      help="adapters kept in memory, least recently used dropped and read again when asked for "
                           "(default: --max-loras)")
    parser.add_argument("--max-queue", type=int, default=256,
                        help="requests that may wait for a running slot; beyond it RESOURCE_EXHAUSTED")
    parser.add_argument("--max-inflight-tensor-bytes", type=int, default=4 << 30,
                        help="request tensor bytes held at once across calls; beyond it RESOURCE_EXHAUSTED")
    parser.add_argument("--upload-idle-timeout", type=float, default=30.0,
                        help="seconds a Generate upload may stall between parts before DEADLINE_EXCEEDED")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus /metrics on --host at this port (0: a free one); default off")
    parser.add_argument("--tls-cert", default=None, help="PEM certificate: serve TLS (with --tls-key)")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument("--tls-ca", default=None,
                        help="PEM CA: require client certificates signed by it (mTLS)")
    parser.add_argument("--api-key", default=None,
                        help="require 'authorization: Bearer KEY' from callers, i.e. preprocessors "
                             "(default: $SPLICE_ENGINE_API_KEY); health stays open")
    parser.add_argument("--max-connection-age", type=float, default=300.0,
                        help="seconds after which each client connection is closed once its streams end, so "
                             "preprocessors re-resolve a dns:/// target and find new replicas (0: never)")
    parser.add_argument("--drain-grace", type=float, default=DEFAULT_GRACE,
                        help="on SIGTERM: seconds running streams get to finish (health NOT_SERVING and new calls "
                             "UNAVAILABLE meanwhile)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


def config_from_args(args: argparse.Namespace, folder: str, resolve: Resolve | None = None) -> EngineConfig:
    """The engine's flags as an EngineConfig for the model in `folder` (`resolve`: an adapter's PATH that is no
    folder -> its folder); ValueError names a flag out of range."""
    from engine.config import EngineConfig, auto_compute_threads, auto_torch_threads

    loras = parse_lora_modules(args.lora_modules)
    if resolve is not None:
        loras = tuple((name, path if os.path.isdir(path) else resolve(path)) for name, path in loras)

    return EngineConfig(model=folder, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
                        max_running_seqs=args.max_running_seqs,
                        max_seqs_per_request=args.max_seqs_per_request, max_batch_tokens=args.max_batch_tokens,
                        max_queue=args.max_queue, model_name=args.model,
                        max_inflight_tensor_bytes=args.max_inflight_tensor_bytes,
                        upload_idle_timeout=args.upload_idle_timeout,
                        tensor_parallel_size=args.tensor_parallel_size,
                        mixed_prefill_tokens=args.mixed_prefill_tokens, stream_interval=args.stream_interval,
                        max_unread_tokens=args.max_unread_tokens, unread_timeout=args.unread_timeout,
                        model_impl=args.model_impl, structured_compile_timeout=args.structured_compile_timeout,
                        structured_cache_mb=args.structured_cache_mb,
                        encoder_cache_mb=args.encoder_cache_mb,
                        enable_prefix_caching=args.enable_prefix_caching, block_size=args.block_size,
                        prefix_cache_mb=args.prefix_cache_mb, simulate_forward_ms=args.simulate_forward_ms,
                        enable_lora=args.enable_lora, lora_modules=loras, max_loras=args.max_loras,
                        max_lora_rank=args.max_lora_rank, max_cpu_loras=args.max_cpu_loras,
                        torch_threads=(args.torch_threads if args.torch_threads is not None
                                       else auto_torch_threads(args.tensor_parallel_size)),
                        compute_threads=(args.compute_threads if args.compute_threads is not None
                                         else None if args.torch_threads is not None
                                         else auto_compute_threads(args.tensor_parallel_size)))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def weights_bytes(folder: str) -> int:
    """The bytes of the weight files directly in `folder`."""
    with os.scandir(folder) as entries:
        return sum(e.stat().st_size for e in entries if e.is_file() and e.name.endswith(WEIGHT_SUFFIXES))


async def _serve(args: argparse.Namespace, resolve: Resolve) -> None:
    from engine.server import EngineServer
    from splice.metrics import start_exporter

    folder = resolve(args.model)
    if (env := heap.huge_pages_env(os.environ, weights_bytes(folder))) is not None:  # (heap.huge_pages_env: why)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)  # the same pid, started again; --model is resolved by now
    if args.metrics_port is not None:  # the metrics line precedes the ready line
        exporter = start_exporter(args.host, args.metrics_port)
        print(f"engine metrics on {exporter.address}", flush=True)
    cfg = config_from_args(args, folder, resolve)
    server = EngineServer(cfg, args.host, args.port, tls=server_tls(args.tls_cert, args.tls_key, args.tls_ca),
                          api_key=args.api_key or os.environ.get(ENGINE_KEY_ENV) or None,
                          max_connection_age=args.max_connection_age)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await server.start(on_ready=lambda addr: print(f"engine serving on {addr}", flush=True))
        await stop.wait()
    finally:
        await server.stop(args.drain_grace)


def run(args: argparse.Namespace, resolve: Resolve, check: CheckModel | None = None) -> int:
    busy = first_unbindable([Listen("--port", args.host, args.port),
                             Listen("--metrics-port", args.host, args.metrics_port or 0)])
    if busy:  # before the model loads, and before the flags' check imports torch (seconds)
        print(f"splice engine: {busy}", file=sys.stderr)
        return 2
    if model_refused("engine", args.model, check):
        return 2
    try:
        server_tls(args.tls_cert, args.tls_key, args.tls_ca)
        config_from_args(args, args.model or "")  # flags out of range: one line now, not a traceback after loading
    except ValueError as exc:
        print(f"splice engine: {exc}", file=sys.stderr)
        return 2
    heap.serve_blocks_from_heap()  # per-step tensors without a mapping each; one arena, whose top trims return
    return run_service("engine", _serve(args, resolve), args.log_level)
