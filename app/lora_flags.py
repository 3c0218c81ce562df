"""`splice up`'s LoRA flags (vLLM's): the engine serves the adapters, the preprocessor's HTTP face the runtime
load/unload routes."""

from __future__ import annotations

import argparse


def add_up_arguments(p: argparse.ArgumentParser) -> None:
    lora = p.add_argument_group("LoRA adapters (vLLM's flags; `model: NAME` picks one per request)")
    lora.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters in PEFT's format")
    lora.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                      help='adapters served from the start: NAME=PATH or vLLM\'s JSON {"name": ..., "path": ...}; '
                           "PATH a PEFT folder or a built-in adapter (e.g. tiny-text-lora)")
    lora.add_argument("--max-loras", type=int, default=None, help="distinct adapters in one step (default: 1)")
    lora.add_argument("--max-lora-rank", type=int, default=None, help="largest rank served (default: 16)")
    lora.add_argument("--max-cpu-loras", type=int, default=None,
                      help="adapters kept in memory, least recently used dropped (default: --max-loras)")
    lora.add_argument("--allow-runtime-lora-updating", action="store_true",
                      help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's switch)")


def up_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(the engine's flags, the preprocessor's flags) for `splice up`'s LoRA flags."""
    engine = ["--enable-lora"] if args.enable_lora else []
    if args.lora_modules:
        engine += ["--lora-modules", *args.lora_modules]
    for flag in ("max_loras", "max_lora_rank", "max_cpu_loras"):
        if getattr(args, flag) is not None:
            engine += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return engine, ["--allow-runtime-lora-updating"] if args.allow_runtime_lora_updating else []
