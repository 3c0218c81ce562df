"""Aggregate tokens/s of the engine in this process (no transport) at 1, 8 and 32 concurrent requests against HF
`generate`: how much of the whole stack's gap to a static batch is the engine's own.

    python -m bench.experiments.engine_batching [--model tiny-text] [--concurrency 1 8 32] [--new-tokens 64]
                                                [--model-impl auto|splice|transformers] [--quick]

Every request is greedy with ignore_eos and the same number of new tokens; prompts are 16-64 ordinary token IDs.
HF runs
two ways on the same prompts: `hf-serial` (one generate call per request, what serving without batching
does) and `hf-batched` (one left-padded generate call for all N, static batching: everyone waits for
the whole batch). Ratios are engine tokens/s divided by each.
"""

from __future__ import annotations

import asyncio
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.models import resolve_model
from bench.common import bench_parser, hf_generate, prompts
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from splice.engine_request import EngineRequest
from splice.sampling import SamplingParams


async def engine_run(engine: LLMEngine, batch: list[list[int]], new_tokens: int) -> tuple[int, float]:
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=new_tokens)

    async def one(i: int, ids: list[int]) -> int:
        return sum([len(o.token_ids) async for o in engine.generate(EngineRequest(f"b{i}", ids, sampling=params))])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(batch)))
    return sum(counts), time.perf_counter() - start


def hf_run(model, batch: list[list[int]], new_tokens: int, batched: bool) -> tuple[int, float]:
    start = time.perf_counter()
    if batched:
        tokens = hf_generate(model, batch, new_tokens)
    else:
        tokens = sum(hf_generate(model, [p], new_tokens) for p in batch)
    return tokens, time.perf_counter() - start


async def main() -> None:
    parser = bench_parser(__doc__, quick={"concurrency": [1, 4], "new_tokens": 8}, repeats=None, concurrency=[1, 8, 32],
                          new_tokens=64)
    parser.add_argument("--model-impl", default="auto", choices=["auto", "splice", "transformers"],
                        help="the engine's --model-impl (what runs its text stack)")
    args = parser.parse_args()
    new_tokens = args.new_tokens
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    engine = LLMEngine(EngineConfig(model=resolve_model(args.model), max_running_seqs=max(args.concurrency),
                                    model_impl=args.model_impl))
    engine.start()
    await engine.warmup()
    model = engine.m.model
    hf_generate(model, prompts(2), 2)  # warm HF too

    print(f"model {args.model} (text stack: {engine.m.family.impl}), {new_tokens} new tokens per request, "
          "prompts 16-64 tokens, "
          f"{torch.get_num_threads()} torch thread(s), device {engine.m.device}")
    print(f"{'conc':>5} {'engine tok/s':>13} {'hf-serial':>10} {'hf-batched':>11} {'x serial':>9} {'x batched':>10}")
    try:
        for n in args.concurrency:
            batch = prompts(n, seed=n)
            et, es = await engine_run(engine, batch, new_tokens)
            st, ss = hf_run(model, batch, new_tokens, batched=False)
            bt, bs = hf_run(model, batch, new_tokens, batched=True)
            e, s, b = et / es, st / ss, bt / bs
            print(f"{n:>5} {e:>13.0f} {s:>10.0f} {b:>11.0f} {e / s:>9.2f} {e / b:>10.2f}", flush=True)
    finally:
        engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
