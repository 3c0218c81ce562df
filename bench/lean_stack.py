"""Whole-stack tok/s with the engine on Splice's own text-stack forward (`--model-impl splice`) vs the same stack on
transformers' modules (`--model-impl transformers`): two stacks up at once, runs alternating, ratio per repeat.

    python -m bench.lean_stack [--model tiny-text] [--streams 64] [--new-tokens 64] [--repeats 3]
                               [--stream-interval 1] [--engine-args '...']

The same requests as bench.stack_throughput (its options too); comparing the two stacks with each other directly,
rather than each with an HF static batch measured at another moment, keeps the noise of a shared machine out of
the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.measure import report_paired
from bench.stack_throughput import lengths, prompts, stack_parser, stack_run, start_bench_stack
from clients import AsyncSpliceClient


async def main() -> None:
    args = stack_parser(__doc__).parse_args()
    stacks = {}
    try:
        for impl in ("splice", "transformers"):
            stacks[impl] = start_bench_stack(argparse.Namespace(**{
                **vars(args), "engine_args": f"{args.engine_args} --model-impl {impl}"}))
        batch = prompts(args.streams)
        wanted = lengths(args.streams, args.new_tokens, False)
        clients = {impl: AsyncSpliceClient(pre.address, timeout=600) for impl, (_, pre) in stacks.items()}
        tps: dict[str, list[float]] = {impl: [] for impl in stacks}
        for client in clients.values():
            await stack_run(client, batch[:4], [4] * 4)  # warm both
        for k in range(args.repeats):
            for impl in ("splice", "transformers") if k % 2 == 0 else ("transformers", "splice"):
                tps[impl].append(await stack_run(clients[impl], batch, wanted))
        for client in clients.values():
            await client.close()
        setup = ", ".join([*([f"--stream-interval {args.stream_interval}"] if args.stream_interval > 1 else []),
                           *([args.engine_args] if args.engine_args else [])]) or "default flags"
        report_paired(f"{args.model}: stack tok/s at {args.streams} streams ({setup}), --model-impl splice vs "
                      "transformers", tps["splice"], tps["transformers"], "tok/s")
    finally:
        for engine, pre in stacks.values():
            pre.stop()
            engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
