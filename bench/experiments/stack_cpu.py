"""Where the per-token CPU goes in the stack: CPU seconds per generated token in the engine process, the
preprocessor process and this (client) process, at N concurrent streams, and how many tokens each client chunk
carried (above 1 when readers fell behind and the pending tokens were merged).

    python -m bench.experiments.stack_cpu [--model tiny-text] [--streams 64] [--new-tokens 64] [--repeats 3]
                                          [--stream-interval 1] [--engine-args '...'] [--quick]

CPU time is read from /proc for the services and from getrusage for this process, so it counts every thread
(the engine's forward, gRPC's pollers). Run it on two checkouts back to back to compare them.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.common import prompts
from bench.stacks import engine_flags, running_stack, stack_parser
from clients import AsyncSpliceClient


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main() -> None:
    args = stack_parser(__doc__).parse_args()
    with running_stack(args.model, engine_args=engine_flags(args)) as (engine, pre):
        async with AsyncSpliceClient(pre.address, timeout=600) as client:
            async def one(ids: list[int], n: int) -> tuple[int, int]:
                chunks = tokens = 0
                async for c in client.complete([ids], temperature=0.0, ignore_eos=True, max_tokens=n):
                    chunks, tokens = chunks + 1, tokens + len(c.token_ids)
                return chunks, tokens

            batch = prompts(args.streams)
            await asyncio.gather(*(one(ids, 4) for ids in batch[:4]))  # warm
            before = (process_cpu(engine.proc.pid), process_cpu(pre.proc.pid), own_cpu())
            start = time.perf_counter()
            chunks = tokens = 0
            for _ in range(args.repeats):
                for c, t in await asyncio.gather(*(one(ids, args.new_tokens) for ids in batch)):
                    chunks, tokens = chunks + c, tokens + t
            wall = time.perf_counter() - start
            after = (process_cpu(engine.proc.pid), process_cpu(pre.proc.pid), own_cpu())
    us = [(b - a) / tokens * 1e6 for a, b in zip(before, after, strict=True)]
    print(f"{args.model}: {tokens} tokens at {args.streams} streams, {tokens / wall:.0f} tok/s, "
          f"{tokens / chunks:.2f} tokens per client chunk; CPU us/token: engine {us[0]:.0f}, "
          f"preprocessor {us[1]:.0f}, client {us[2]:.0f}, total {sum(us):.0f}", flush=True)

if __name__ == "__main__":
    asyncio.run(main())
