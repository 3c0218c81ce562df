"""Whole-stack tokens/s with penalties, min_p and top_logprobs=5 on every request vs the same requests without them,
measured in turns in one run (ratio per repeat; target >= 0.85: the controls may cost at most 15%).

    python -m bench.sampling_controls [--model tiny-text] [--streams 64] [--new-tokens 128] [--repeats 3]
                                      [--no-top-logprobs] [--quick]

Every request samples (temperature 0.8, seeded) and is ignore_eos; prompts are 16-64 ordinary token IDs (Complete).
The controlled side adds repetition, frequency and presence penalties, min_p and the 5 most likely tokens' logprobs
to each request, so the engine keeps per-row penalty state, runs the penalty, min_p and top-k logprob ops on the
whole batch at every step, and every token carries 5 alternatives over both gRPC hops (--no-top-logprobs: the
penalties and min_p alone).
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.common import in_turns_async, prompts, report
from bench.stacks import engine_flags, running_stack, stack_parser, stack_run, warm
from clients import AsyncSpliceClient

PENALTIES = dict(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2, min_p=0.05)
TOP_LOGPROBS = dict(logprobs=True, top_logprobs=5)
SAMPLED = dict(temperature=0.8, seed=0)


async def main() -> None:
    parser = stack_parser(__doc__, new_tokens=128)
    parser.add_argument("--no-top-logprobs", action="store_true", help="penalties and min_p only")
    args = parser.parse_args()
    controls = PENALTIES if args.no_top_logprobs else {**PENALTIES, **TOP_LOGPROBS}
    batch, wanted = prompts(args.streams), [args.new_tokens] * args.streams
    with running_stack(args.model, engine_args=engine_flags(args)) as (_, pre):
        async with AsyncSpliceClient(pre.address, timeout=600) as client:
            await warm(client)
            sides = {"controls": lambda: stack_run(client, batch, wanted, **SAMPLED, **controls),
                     "none": lambda: stack_run(client, batch, wanted, **SAMPLED)}
            await in_turns_async(sides, 1)  # warm both paths
            tps = await in_turns_async(sides, args.repeats)
    what = "penalties + min_p" + ("" if args.no_top_logprobs else " + top_logprobs=5")
    report(f"{args.model}: stack tok/s at {args.streams} streams x {args.new_tokens} tokens, {what} on every request "
           "vs none", tps["controls"], tps["none"], "tok/s")


if __name__ == "__main__":
    asyncio.run(main())
