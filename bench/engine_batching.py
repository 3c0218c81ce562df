"""Aggregate tokens/s of the engine at 1, 8 and 32 concurrent requests against HF `generate`, same process.

    python -m bench.engine_batching [--model tiny-text] [--quick] [--model-impl auto|splice|transformers]

Every request is greedy with ignore_eos and the same number of new tokens; prompt lengths vary. HF runs
two ways on the same prompts: `hf-serial` (one generate call per request, what serving without batching
does) and `hf-batched` (one left-padded generate call for all N, static batching: everyone waits for
the whole batch). Ratios are engine tokens/s divided by each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.models import resolve_model
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from splice.engine_request import EngineRequest
from splice.sampling import SamplingParams


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, vocab, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


async def engine_run(engine: LLMEngine, batch: list[list[int]], new_tokens: int) -> tuple[int, float]:
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=new_tokens)

    async def one(i: int, ids: list[int]) -> int:
        return sum([len(o.token_ids) async for o in engine.generate(EngineRequest(f"b{i}", ids, sampling=params))])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(batch)))
    return sum(counts), time.perf_counter() - start


@torch.inference_mode()
def hf_generate(model, batch: list[list[int]], new_tokens: int) -> int:
    longest = max(map(len, batch))
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in batch])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, pad_token_id=0)
    return (out.shape[1] - longest) * len(batch)


def hf_run(model, batch: list[list[int]], new_tokens: int, batched: bool) -> tuple[int, float]:
    start = time.perf_counter()
    if batched:
        tokens = hf_generate(model, batch, new_tokens)
    else:
        tokens = sum(hf_generate(model, [p], new_tokens) for p in batch)
    return tokens, time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-text")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="fewer new tokens (16), for a fast look")
    parser.add_argument("--model-impl", default="auto", choices=["auto", "splice", "transformers"],
                        help="the engine's --model-impl (what runs its text stack)")
    args = parser.parse_args()
    new_tokens = 16 if args.quick else args.new_tokens
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    engine = LLMEngine(EngineConfig(model=resolve_model(args.model), max_running_seqs=max(args.concurrency),
                                    model_impl=args.model_impl))
    engine.start()
    await engine.warmup()
    model = engine.m.model
    vocab = engine.info.vocab_rows
    hf_generate(model, prompts(2, vocab), 2)  # warm HF too

    print(f"model {args.model} (text stack: {engine.m.family.impl}), {new_tokens} new tokens per request, "
          "prompts 16-64 tokens, "
          f"{torch.get_num_threads()} torch thread(s), device {engine.m.device}")
    print(f"{'conc':>5} {'engine tok/s':>13} {'hf-serial':>10} {'hf-batched':>11} {'x serial':>9} {'x batched':>10}")
    try:
        for n in args.concurrency:
            batch = prompts(n, vocab, seed=n)
            et, es = await engine_run(engine, batch, new_tokens)
            st, ss = hf_run(model, batch, new_tokens, batched=False)
            bt, bs = hf_run(model, batch, new_tokens, batched=True)
            e, s, b = et / es, st / ss, bt / bs
            print(f"{n:>5} {e:>13.0f} {s:>10.0f} {b:>11.0f} {e / s:>9.2f} {e / b:>10.2f}", flush=True)
    finally:
        engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
