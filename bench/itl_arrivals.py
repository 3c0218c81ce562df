"""Inter-token latency p99 of RUNNING in-process streams while ARRIVING more join (what a burst of new prompts costs
the streams already decoding), vs the same streams at the same token positions with nobody arriving (the
baseline), in one run.

    python -m bench.itl_arrivals [--model tiny-text] [--running 32] [--arriving 32] [--prompt 512] [--repeats 3]
                                 [--mixed-prefill-tokens N] [--quick]

The running streams have 16-64 token prompts; the arrivals have PROMPT-token prompts and come one every 5 ms.
Intervals are between consecutive tokens of one running stream, as its consumer on the event loop sees them.
Under arrivals: every interval overlapping the span from the first arrival until every arrival has its first
token. Baseline: each repeat runs the same streams again (same prompts, greedy, so the same tokens) without
arrivals, and takes the intervals at the same token positions: a decode step costs more as contexts grow, and the
smaller the prefill budget the longer the arrivals last, so a window before them understates the baseline (by up to
2x here) and penalizes small budgets. Also printed against the streams' steady state before the arrivals (the 30
steps before the first one), an earlier baseline kept for comparison. Both p99s of a ratio come from the same repeat,
so the ratio is taken per repeat and printed as median [min..max] over repeats (not a ratio of medians that pairs
one repeat's load with another's baseline). Also printed: the arrivals' time to first token (from their generate
call), p50 and max over the arrivals of a repeat, as median [min..max] over repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time
from contextlib import aclosing

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.models import resolve_model
from bench.common import bench_parser, prompts, report, spread
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from splice.engine_request import EngineRequest
from splice.sampling import SamplingParams


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))]


async def run_streams(engine: LLMEngine, args: argparse.Namespace, seed: int, arrive: bool,
                      until: list[int] | None = None) -> tuple[list[list[float]], float, float, list[float]]:
    """RUNNING greedy streams (16-64 token prompts from `seed`) and, if `arrive`, ARRIVING PROMPT-token prompts one
    every 5 ms once every stream has 40 tokens -> (each stream's token times, the arrivals' window start and end,
    the arrivals' TTFTs in ms). Without arrivals each stream i stops after until[i] tokens."""
    running_ids = prompts(args.running, seed)
    arriving_ids = prompts(args.arriving, seed + 10_000, lengths=(args.prompt, args.prompt))
    greedy = dict(temperature=0.0, ignore_eos=True)
    stamps: list[list[float]] = [[] for _ in range(args.running)]
    first_tokens: list[float] = []
    ttfts: list[float] = []
    arrivals_done = asyncio.Event()

    async def running(i: int) -> None:
        req = EngineRequest(f"run{i}", running_ids[i], sampling=SamplingParams(max_tokens=100_000, **greedy))
        # aclosing: leaving early aborts the sequence now, not when the generator is collected
        async with aclosing(engine.generate(req)) as outs:
            async for out in outs:
                stamps[i] += [time.perf_counter()] * len(out.token_ids)
                if arrivals_done.is_set() or (until is not None and len(stamps[i]) >= until[i]):
                    return

    async def arriving(i: int) -> None:
        req = EngineRequest(f"arr{i}", arriving_ids[i], sampling=SamplingParams(max_tokens=4, **greedy))
        sent = time.perf_counter()
        async with aclosing(engine.generate(req)) as outs:
            async for _ in outs:
                first_tokens.append(time.perf_counter())
                ttfts.append((first_tokens[-1] - sent) * 1e3)
                break

    tasks = [asyncio.create_task(running(i)) for i in range(args.running)]
    while min(len(s) for s in stamps) < 40:
        await asyncio.sleep(0.01)
    start = end = time.perf_counter()
    if arrive:
        newcomers = []
        for i in range(args.arriving):
            newcomers.append(asyncio.create_task(arriving(i)))
            await asyncio.sleep(0.005)
        await asyncio.gather(*newcomers)
        end = max(first_tokens)
        arrivals_done.set()
    await asyncio.gather(*tasks)
    return stamps, start, end, ttfts


async def one_repeat(engine: LLMEngine, args: argparse.Namespace, seed: int) -> tuple[float, float, float, list[float]]:
    """-> (loaded ITL p99 ms, steady ITL p99 ms before the arrivals, control ITL p99 ms at the same token positions
    without arrivals, the arrivals' TTFTs in ms)."""
    stamps, start, end, ttfts = await run_streams(engine, args, seed, arrive=True)
    steady, loaded = [], []
    spans = []  # per stream: the token positions [lo, hi) whose intervals overlap the arrivals
    for s in stamps:
        gaps = list(itertools.pairwise(s))
        # (tokens that came in one output have no interval between them: left out, on every side)
        steady += [b - a for a, b in gaps if a < b < start][-30:]
        # Every interval that overlaps the arrivals, not only those ending inside them: when the prefills run
        # back to back, the stall they cause is one interval that ends after the last arrival's first token.
        inside = [k for k, (a, b) in enumerate(gaps) if b >= start and a <= end]
        loaded += [gaps[k][1] - gaps[k][0] for k in inside if gaps[k][1] > gaps[k][0]]
        spans.append((inside[0], inside[-1] + 1) if inside else (0, 0))
    # The same streams again (same prompts, greedy: the same tokens) without arrivals: a decode step costs more as
    # contexts grow, and the arrivals' window lasts longer the smaller the prefill budget, so the fair baseline is
    # the same token positions with nobody arriving.
    again, _, _, _ = await run_streams(engine, args, seed, arrive=False, until=[hi + 2 for _, hi in spans])
    control = []
    for s, (lo, hi) in zip(again, spans, strict=True):
        control += [b - a for a, b in itertools.pairwise(s[lo:hi + 1]) if b > a]
    return p99(loaded) * 1e3, p99(steady) * 1e3, p99(control) * 1e3, ttfts


async def main() -> None:
    parser = bench_parser(__doc__, quick={"running": 4, "arriving": 4, "prompt": 64, "repeats": 1}, running=32,
                          arriving=32, prompt=512)
    parser.add_argument("--mixed-prefill-tokens", type=int, default=None,
                        help="prompt positions a step prefills while streams decode (default: the engine's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    limits = {} if args.mixed_prefill_tokens is None else {"mixed_prefill_tokens": args.mixed_prefill_tokens}
    cfg = EngineConfig(model=str(resolve_model(args.model)), max_running_seqs=args.running + args.arriving, **limits)
    engine = LLMEngine(cfg)
    engine.start()
    await engine.warmup()
    try:
        loaded, steady, control, ttft_mid, ttft_max = [], [], [], [], []
        for r in range(args.repeats):
            a, b, c, ttfts = await one_repeat(engine, args, r)
            loaded.append(a)
            steady.append(b)
            control.append(c)
            ttft_mid.append(statistics.median(ttfts))
            ttft_max.append(max(ttfts))
        report(f"{args.model}: ITL p99 of {args.running} streams while {args.arriving} arrive vs the same token "
               f"positions without arrivals", loaded, control, "ms")
        report(f"{args.model}: ITL p99 of {args.running} streams while {args.arriving} arrive vs their steady "
               f"state before the arrivals", loaded, steady, "ms")
        print(f"{args.model}: TTFT of the {args.arriving} arrivals ({args.prompt}-token prompts): p50 "
              f"{spread(ttft_mid)} ms | max {spread(ttft_max)} ms (n={args.repeats})", flush=True)
    finally:
        engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
