"""Whole-stack tokens/s at N concurrent streams (client -> preprocessor -> engine processes) vs HF's static
batching (one left-padded `generate` of the same prompts in this process), measured in turns in one run.

    python -m bench.stack_throughput [--model tiny-text] [--streams 64] [--new-tokens 64] [--repeats 3]
                                     [--stream-interval 1] [--lengths same|varied] [--engine-args '...'] [--quick]

Every request is greedy and ignore_eos; prompts are 16-64 ordinary token IDs (Complete). `same`: every request
asks for NEW_TOKENS (static batching's best case). `varied`: each asks for its own count, drawn from
8..2*NEW_TOKENS-8 (mean NEW_TOKENS), as real answers differ in length; one static batch then runs until its
longest row is done, and both sides are credited only the tokens each request asked for. HF runs on one torch
thread while the stack is idle; the ratio is taken per repeat.
"""

from __future__ import annotations

import asyncio
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.models import resolve_model
from bench.common import hf_generate, in_turns_async, prompts, report
from bench.stacks import engine_flags, lengths, running_stack, setup, stack_parser, stack_run, warm
from clients import AsyncSpliceClient
from engine.config import EngineConfig
from engine.loader import load


async def main() -> None:
    parser = stack_parser(__doc__)
    parser.add_argument("--lengths", choices=("same", "varied"), default="same")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load(EngineConfig(model=str(resolve_model(args.model)), model_impl="transformers")).model
    batch = prompts(args.streams)
    wanted = lengths(args.streams, args.new_tokens, args.lengths == "varied")
    with running_stack(args.model, engine_args=engine_flags(args)) as (_, pre):
        async with AsyncSpliceClient(pre.address, timeout=600) as client:
            await warm(client)
            hf_generate(model, batch[:4], 4)

            async def hf() -> float:
                """One static batch until its longest row is done; credited the tokens each request asked for."""
                start = time.perf_counter()
                hf_generate(model, batch, max(wanted))
                return sum(wanted) / (time.perf_counter() - start)

            tps = await in_turns_async({"ours": lambda: stack_run(client, batch, wanted), "hf": hf}, args.repeats)
    report(f"{args.model}: stack tok/s at {args.streams} streams ({args.lengths} lengths, {setup(args)}) vs one HF "
           "static batch", tps["ours"], tps["hf"], "tok/s")


if __name__ == "__main__":
    asyncio.run(main())
