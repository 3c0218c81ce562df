"""Issue 14: aggregate whole-stack tokens/s through one preprocessor with 1 vs 2 engine replicas behind one gRPC
target (`ipv4:HOST:P1,HOST:P2`, weighted round robin on the engines' load reports), side by side in one run.

    python -m bench.replicas [--model tiny-text] [--streams 32] [--new-tokens 64] [--repeats 3] [--engine-threads 1]

Both setups run at once (three engines, two preprocessors) and are measured alternately, so drift in the
machine's load hits both. Each engine runs torch at --engine-threads: on this 2-core machine two replicas at one
thread each can use both cores where one cannot; with a GPU per replica the gain is the replica count.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from app.launch import Service, start, wait_healthy
from app.scrape import scrape, total
from bench.measure import report
from bench.stack_throughput import prompts, stack_run
from clients import AsyncSpliceClient


def _engine(model: str, threads: int) -> Service:
    engine = start("engine", ["--model", model, "--port", "0", "--metrics-port", "0"],
                   env={"OMP_NUM_THREADS": str(threads)})
    wait_healthy(engine.address)
    return engine


async def _measure(args: argparse.Namespace, one: str, two: str) -> tuple[list[float], list[float]]:
    batch = prompts(args.streams)
    singles, pairs = [], []
    async with AsyncSpliceClient(one) as c1, AsyncSpliceClient(two) as c2:
        await stack_run(c1, batch[:4], [4] * 4)  # warm both paths
        await stack_run(c2, batch[:4], [4] * 4)
        for _ in range(args.repeats):
            singles.append(await stack_run(c1, batch, [args.new_tokens] * len(batch)))
            pairs.append(await stack_run(c2, batch, [args.new_tokens] * len(batch)))
    return pairs, singles


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-text")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--engine-threads", type=int, default=1)
    args = p.parse_args()
    engines = [_engine(args.model, args.engine_threads) for _ in range(3)]
    solo = start("preprocessor", ["--engine", engines[0].address, "--port", "0"])
    duo = start("preprocessor", ["--engine", "ipv4:" + ",".join(e.address for e in engines[1:]), "--port", "0"])
    try:
        for pre in (solo, duo):
            wait_healthy(pre.address)
        pairs, singles = asyncio.run(_measure(args, solo.address, duo.address))
        print(f"{args.streams} streams x {args.new_tokens} tokens, {args.model}, engines at "
              f"{args.engine_threads} torch thread(s), {os.cpu_count()} cores")
        report("aggregate tok/s, 2 replicas vs 1", pairs, singles, "tok/s")
        split = [int(total(scrape(e), "splice_engine_requests_finished_total")) for e in engines[1:]]
        print(f"requests per replica of the pair: {split}")
    finally:
        for service in (duo, solo, *engines):
            service.stop(grace=5)


if __name__ == "__main__":
    main()
