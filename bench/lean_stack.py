"""Whole-stack tokens/s with the engine on Splice's own text-stack forward (`--model-impl splice`) vs the same stack
on transformers' modules (`--model-impl transformers`): two stacks up at once, measured in turns, ratio per repeat.

    python -m bench.lean_stack [--model tiny-text] [--streams 64] [--new-tokens 64] [--repeats 3]
                               [--stream-interval 1] [--engine-args '...'] [--quick]

The same requests as bench.stack_throughput (greedy, ignore_eos, NEW_TOKENS each; prompts of 16-64 ordinary token
IDs). Comparing the two stacks with each other directly, rather than each with an HF static batch measured at
another moment, keeps the noise of a shared machine out of the ratio.
"""

from __future__ import annotations

import asyncio
import functools
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.common import in_turns_async, prompts, report
from bench.stacks import setup, side_by_side, stack_parser, stack_run

IMPLS = ("splice", "transformers")


async def main() -> None:
    args = stack_parser(__doc__).parse_args()
    batch, wanted = prompts(args.streams), [args.new_tokens] * args.streams
    async with side_by_side(args, {impl: ["--model-impl", impl] for impl in IMPLS}) as clients:
        tps = await in_turns_async({impl: functools.partial(stack_run, client, batch, wanted)
                                    for impl, client in clients.items()}, args.repeats)
    report(f"{args.model}: stack tok/s at {args.streams} streams ({setup(args)}), --model-impl splice vs "
           "transformers", tps["splice"], tps["transformers"], "tok/s")


if __name__ == "__main__":
    asyncio.run(main())
