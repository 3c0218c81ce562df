"""Row 2: whole-stack tokens/s at N concurrent streams (client -> preprocessor -> engine processes) vs one HF
static batch (`generate` on the same prompts, left-padded), measured side by side in one run.

    python -m bench.stack_throughput [--model tiny-text] [--streams 64] [--new-tokens 64] [--repeats 3]
                                     [--stream-interval 1]

Every request is greedy, ignore_eos, the same number of new tokens; prompts are 16-64 ordinary token IDs
(Complete). HF runs in this process on one torch thread while the stack is idle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.launch import start_stack
from app.models import resolve_model
from bench.engine_batching import hf_generate
from bench.measure import report
from clients import AsyncSpliceClient
from engine.config import EngineConfig
from engine.loader import load


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(40, 600, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


async def stack_run(client: AsyncSpliceClient, batch: list[list[int]], new_tokens: int) -> float:
    async def one(ids: list[int]) -> int:
        return sum([len(c.token_ids) async for c in client.complete([ids], temperature=0.0, ignore_eos=True,
                                                                     max_tokens=new_tokens)])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(ids) for ids in batch))
    assert sum(counts) == new_tokens * len(batch), counts
    return sum(counts) / (time.perf_counter() - start)


def hf_run(model, batch: list[list[int]], new_tokens: int) -> float:
    start = time.perf_counter()
    tokens = hf_generate(model, batch, new_tokens)
    return tokens / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-text")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stream-interval", type=int, default=1, help="the engine's --stream-interval")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load(EngineConfig(model=str(resolve_model(args.model)))).model
    engine, pre = start_stack(args.model, engine_args=["--max-running-seqs", str(args.streams),
                                                       "--stream-interval", str(args.stream_interval)])
    try:
        async with AsyncSpliceClient(pre.address, timeout=600) as client:
            batch = prompts(args.streams)
            await stack_run(client, batch[:4], 4)  # warm both paths
            hf_run(model, batch[:4], 4)
            ours, base = [], []
            for _ in range(args.repeats):
                ours.append(await stack_run(client, batch, args.new_tokens))
                base.append(hf_run(model, batch, args.new_tokens))
        interval = f", --stream-interval {args.stream_interval}" if args.stream_interval > 1 else ""
        report(f"{args.model}: stack tok/s at {args.streams} streams{interval} vs one HF static batch", ours, base,
               "tok/s",
               "ours/base")
    finally:
        pre.stop()
        engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
