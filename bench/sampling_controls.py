"""Issue 23's row: whole-stack tokens/s with penalties, min_p and top_logprobs=5 on every request vs the same requests
without them, measured side by side in one run (ratio per repeat; target >= 0.85).

    python -m bench.sampling_controls [--model tiny-text] [--streams 64] [--new-tokens 128] [--repeats 3]
                                      [--no-top-logprobs]

Every request samples (temperature 0.8, its own seed) and is ignore_eos; prompts are 16-64 ordinary token IDs
(Complete). The controlled side adds repetition, frequency and presence penalties, min_p and the 5 most likely tokens'
logprobs to each request, so the engine keeps per-row penalty state, runs the penalty, min_p and top-k logprob ops on
the whole batch at every step, and every token carries 5 alternatives over both gRPC hops (--no-top-logprobs: the
penalties and min_p alone). The two sides take turns going first, so a load that drifts during a repeat favours
neither.
"""

from __future__ import annotations

import asyncio
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.measure import report_paired
from bench.stack_throughput import prompts, stack_parser, start_bench_stack
from clients import AsyncSpliceClient

PENALTIES = dict(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2, min_p=0.05)
TOP_LOGPROBS = dict(logprobs=True, top_logprobs=5)


async def run(client: AsyncSpliceClient, batch: list[list[int]], new_tokens: int, controls: dict) -> float:
    async def one(k: int, ids: list[int]) -> int:
        return sum([len(c.token_ids) async for c in client.complete(
            [ids], temperature=0.8, seed=k, ignore_eos=True, max_tokens=new_tokens, **controls)])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(k, ids) for k, ids in enumerate(batch)))
    assert counts == [new_tokens] * len(batch), counts
    return sum(counts) / (time.perf_counter() - start)


async def main() -> None:
    parser = stack_parser(__doc__)
    parser.set_defaults(new_tokens=128)
    parser.add_argument("--no-top-logprobs", action="store_true", help="penalties and min_p only")
    args = parser.parse_args()
    controls = PENALTIES if args.no_top_logprobs else {**PENALTIES, **TOP_LOGPROBS}
    engine, pre = start_bench_stack(args)
    try:
        async with AsyncSpliceClient(pre.address, timeout=600) as client:
            batch = prompts(args.streams)
            for each in (controls, {}):  # warm both paths
                await run(client, batch[:4], 4, each)
            ours, base = [], []
            for k in range(args.repeats):
                for each in ((controls, {}) if k % 2 == 0 else ({}, controls)):
                    (ours if each else base).append(await run(client, batch, args.new_tokens, each))
        what = "penalties + min_p" + ("" if args.no_top_logprobs else " + top_logprobs=5")
        report_paired(f"{args.model}: stack tok/s at {args.streams} streams x {args.new_tokens} tokens, {what} on "
                      f"every request vs none", ours, base, "tok/s")
    finally:
        pre.stop()
        engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
