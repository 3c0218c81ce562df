"""Row 2: whole-stack tokens/s at N concurrent streams (client -> preprocessor -> engine processes) vs one HF
static batch (`generate` on the same prompts, left-padded), measured side by side in one run.

    python -m bench.stack_throughput [--model tiny-text] [--streams 64] [--new-tokens 64] [--repeats 3]
                                     [--stream-interval 1] [--lengths same|varied] [--engine-args '...']

Every request is greedy and ignore_eos; prompts are 16-64 ordinary token IDs (Complete). `same`: every request
asks for NEW_TOKENS (the issue's row: static batching's best case). `varied`: each asks for its own count, drawn
from 8..2*NEW_TOKENS-8 (mean NEW_TOKENS), as real answers differ in length; one static batch then runs until
its longest row is done, and both sides are credited only the tokens each request asked for. HF runs in this
process on one torch thread while the stack is idle; the ratio is taken per repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.launch import Service, start_stack
from app.models import resolve_model
from bench.engine_batching import hf_generate
from bench.measure import report_paired
from clients import AsyncSpliceClient
from engine.config import EngineConfig
from engine.loader import load


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(40, 600, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def lengths(n: int, new_tokens: int, varied: bool, seed: int = 1) -> list[int]:
    if not varied:
        return [new_tokens] * n
    g = torch.Generator().manual_seed(seed)
    return torch.randint(8, max(9, 2 * new_tokens - 7), (n,), generator=g).tolist()


async def stack_run(client: AsyncSpliceClient, batch: list[list[int]], wanted: list[int]) -> float:
    async def one(ids: list[int], n: int) -> int:
        return sum([len(c.token_ids) async for c in client.complete([ids], temperature=0.0, ignore_eos=True,
                                                                     max_tokens=n)])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(ids, n) for ids, n in zip(batch, wanted, strict=True)))
    assert counts == wanted, counts
    return sum(counts) / (time.perf_counter() - start)


def hf_run(model, batch: list[list[int]], wanted: list[int]) -> float:
    """One static batch until its longest row is done; credited the tokens each request asked for."""
    start = time.perf_counter()
    hf_generate(model, batch, max(wanted))
    return sum(wanted) / (time.perf_counter() - start)


def stack_parser(doc: str) -> argparse.ArgumentParser:
    """The options every whole-stack bench takes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default="tiny-text")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stream-interval", type=int, default=1, help="the engine's --stream-interval")
    parser.add_argument("--engine-args", default="", help="more engine flags, e.g. '--mixed-prefill-tokens 2048'")
    return parser


def start_bench_stack(args: argparse.Namespace) -> tuple[Service, Service]:
    """Engine + preprocessor processes as `stack_parser`'s options ask: a running slot for every stream."""
    return start_stack(args.model, engine_args=["--max-running-seqs", str(args.streams),
                                                "--stream-interval", str(args.stream_interval),
                                                *shlex.split(args.engine_args)])


async def main() -> None:
    parser = stack_parser(__doc__)
    parser.add_argument("--lengths", choices=("same", "varied"), default="same")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load(EngineConfig(model=str(resolve_model(args.model)), model_impl="transformers")).model
    engine, pre = start_bench_stack(args)
    try:
        async with AsyncSpliceClient(pre.address, timeout=600) as client:
            batch = prompts(args.streams)
            wanted = lengths(args.streams, args.new_tokens, args.lengths == "varied")
            await stack_run(client, batch[:4], [4] * 4)  # warm both paths
            hf_run(model, batch[:4], [4] * 4)
            ours, base = [], []
            for _ in range(args.repeats):
                ours.append(await stack_run(client, batch, wanted))
                base.append(hf_run(model, batch, wanted))
        setup = ", ".join([f"{args.lengths} lengths",
                           *([f"--stream-interval {args.stream_interval}"] if args.stream_interval > 1 else []),
                           *([args.engine_args] if args.engine_args else [])])
        report_paired(f"{args.model}: stack tok/s at {args.streams} streams ({setup}) vs one HF static batch", ours,
                      base, "tok/s")
    finally:
        pre.stop()
        engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
