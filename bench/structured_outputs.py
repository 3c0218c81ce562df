"""Whole-stack tokens/s with a JSON schema on every request vs the same requests without one, measured in turns in
one run on the real 49k vocabulary (ratio per repeat; target >= 0.9: the grammar may cost at most 10%).

    python -m bench.structured_outputs [--model smollm2-135m-instruct] [--streams 64] [--new-tokens 64]
                                       [--repeats 3] [--quick]

Every request samples (temperature 0.8, seeded) and is ignore_eos; prompts are 16-64 ordinary token IDs (Complete).
The constrained side sends vLLM's structured_outputs json: an array of at least --new-tokens short strings, so that
no answer completes its grammar before max_tokens and both sides generate the same number of tokens. The engine
compiles the schema once (the first, warming turn), then at every step fills one bitmask row per stream from its
matcher, applies the mask to the whole batch's logits and advances every matcher with its token.
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.common import in_turns_async, prompts, report
from bench.stacks import engine_flags, running_stack, stack_parser, stack_run, warm
from clients import AsyncSpliceClient

SAMPLED = dict(temperature=0.8, seed=0)


def schema(items: int) -> dict:
    return {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": items}


async def main() -> None:
    parser = stack_parser(__doc__, new_tokens=64)
    parser.set_defaults(model="smollm2-135m-instruct")
    args = parser.parse_args()
    batch, wanted = prompts(args.streams), [args.new_tokens] * args.streams
    constrained = {"structured_outputs": {"json": schema(args.new_tokens)}}
    with running_stack(args.model, engine_args=engine_flags(args)) as (_, pre):
        async with AsyncSpliceClient(pre.address, timeout=600) as client:
            await warm(client)
            sides = {"json_schema": lambda: stack_run(client, batch, wanted, **SAMPLED, **constrained),
                     "none": lambda: stack_run(client, batch, wanted, **SAMPLED)}
            await in_turns_async(sides, 1)  # warm both paths (and compile the schema once)
            tps = await in_turns_async(sides, args.repeats)
    report(f"{args.model}: stack tok/s at {args.streams} streams x {args.new_tokens} tokens, a json_schema on every "
           "request vs none", tps["json_schema"], tps["none"], "tok/s")


if __name__ == "__main__":
    asyncio.run(main())
