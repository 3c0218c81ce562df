"""Greedy tokens of the engine in bfloat16 against HF's own generate in bfloat16, on the real model's test prompts
(tests/integration/test_real_model.py's): equal, or where they part and by what margin (HF's top-1 minus top-2
logprob at the parting position, and the engine's): a near tie in bfloat16 is where two correct implementations that
sum in different orders part.

    python -m bench.experiments.bf16_vs_hf [--model smollm2-135m-instruct] [--new-tokens 20]

The engine runs in this process (1 torch thread), as `splice engine --dtype bfloat16` would; HF's model is loaded
alone from the same folder in bfloat16 (transformers' modules, torch's F.linear and SDPA).
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.models import resolve_model
from bench.common import bench_parser
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from splice.engine_request import EngineRequest
from splice.sampling import SamplingParams
from tests.harness.real_prompts import PROMPTS


def margin(logits: torch.Tensor) -> float:
    """Top-1 minus top-2 logprob of one position's logits."""
    top = logits.float().log_softmax(-1).topk(2).values
    return float(top[0] - top[1])


async def main() -> None:
    parser = bench_parser(__doc__, quick={"new_tokens": 8}, model="smollm2-135m-instruct", repeats=None,
                          new_tokens=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    engine = LLMEngine(EngineConfig(model=folder, dtype="bfloat16", max_running_seqs=4))
    engine.start()
    await engine.warmup()
    equal = 0
    try:
        for prompt in PROMPTS:
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)
            with torch.inference_mode():
                out = hf.generate(torch.tensor([ids]), max_new_tokens=args.new_tokens, do_sample=False,
                                  output_scores=True, return_dict_in_generate=True)
            want = out.sequences[0, len(ids):].tolist()
            params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, logprobs=True, top_logprobs=2)
            got, tops = [], []
            async for o in engine.generate(EngineRequest(prompt[:8], ids, sampling=params)):
                got += o.token_ids
                tops += list(o.top_logprobs)
            n = len(want)
            if got[:n] == want:
                equal += 1
                print(f"equal  {prompt!r}: {n} tokens")
                continue
            at = next(i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
            theirs = margin(out.scores[at][0])
            ours = tops[2 * at] - tops[2 * at + 1]  # (top_logprobs: 2 per token, in token order)
            print(f"parts  {prompt!r} at token {at} of {n}: HF {tok.decode(want[at])!r} (its margin {theirs:.4f}), "
                  f"engine {tok.decode(got[at])!r} (its margin {ours:.4f}); the same {at} tokens before")
    finally:
        engine.stop()
    print(f"{equal} of {len(PROMPTS)} prompts give HF's greedy tokens in bfloat16")


if __name__ == "__main__":
    asyncio.run(main())
