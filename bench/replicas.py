"""Aggregate whole-stack tokens/s through one preprocessor with 1 vs 2 engine replicas behind one gRPC target
(`ipv4:HOST:P1,HOST:P2`, weighted round robin on the engines' load reports): both setups up at once (three engines,
two preprocessors), measured in turns, ratio per repeat.

    python -m bench.replicas [--model tiny-text] [--streams 32] [--new-tokens 64] [--repeats 3] [--engine-threads 1]
                             [--quick]

Each engine runs torch at --engine-threads: on a 2-core machine two replicas at one thread each can use both cores
where one cannot; with a GPU per replica the gain is the replica count. Also printed: how the pair split the
requests between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os

from app.launch import Service, start, wait_healthy
from app.scrape import scrape, total
from bench.common import in_turns_async, prompts, report
from bench.stacks import QUICK, engine_flags, stack_parser, stack_run, warm
from clients import AsyncSpliceClient


async def measure(args, one: str, two: str) -> dict[str, list[float]]:
    """tok/s per repeat through the preprocessor at `one` (1 replica) and at `two` (2 replicas)."""
    batch, wanted = prompts(args.streams), [args.new_tokens] * args.streams
    async with AsyncSpliceClient(one) as c1, AsyncSpliceClient(two) as c2:
        await warm(c1)
        await warm(c2)
        return await in_turns_async({"1 replica": functools.partial(stack_run, c1, batch, wanted),
                                     "2 replicas": functools.partial(stack_run, c2, batch, wanted)}, args.repeats)


def main() -> None:
    parser = stack_parser(__doc__, quick={**QUICK, "streams": 4}, streams=32)
    parser.add_argument("--engine-threads", type=int, default=1, help="each engine's --torch-threads")
    args = parser.parse_args()
    with contextlib.ExitStack() as services:
        def up(name: str, flags: list[str]) -> Service:
            service = start(name, flags)
            services.callback(service.stop, grace=5)
            return service

        engines = [up("engine", ["--model", args.model, "--port", "0", "--metrics-port", "0", "--torch-threads",
                                 str(args.engine_threads), *engine_flags(args)]) for _ in range(3)]
        solo = up("preprocessor", ["--engine", engines[0].address, "--port", "0"])
        duo = up("preprocessor", ["--engine", "ipv4:" + ",".join(e.address for e in engines[1:]), "--port", "0"])
        for pre in (solo, duo):
            wait_healthy(pre.address)
        tps = asyncio.run(measure(args, solo.address, duo.address))
        print(f"{args.streams} streams x {args.new_tokens} tokens, {args.model}, engines at {args.engine_threads} "
              f"torch thread(s), {os.cpu_count()} cores")
        report("aggregate tok/s, 2 replicas vs 1", tps["2 replicas"], tps["1 replica"], "tok/s")
        split = [int(total(scrape(e), "splice_engine_requests_finished_total")) for e in engines[1:]]
        print(f"requests per replica of the pair: {split}")


if __name__ == "__main__":
    main()
