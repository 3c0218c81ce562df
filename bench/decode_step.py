"""Row 3: one in-process decode step of ROWS rows x CONTEXT cached positions: the runner vs HF's own unpadded
step (the model's forward on a DynamicCache of the same prompts, no attention mask), side by side.

    python -m bench.decode_step [--model tiny-text] [--rows 64] [--context 1024] [--steps 10] [--repeats 5]

Every row's prompt has CONTEXT positions (nothing is padded), so both do the same arithmetic; each repeat
times `steps` greedy steps of each, interleaved, and takes the median step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from transformers import DynamicCache

from app.models import resolve_model
from bench.measure import report
from engine.config import EngineConfig
from engine.loader import load
from engine.model_runner import ModelRunner, batch_capacity
from splice.engine_request import EngineRequest

GROUP = 8  # prompts prefilled per forward, to bound prefill memory


def median_step(fn, tokens: list[int], steps: int) -> tuple[float, list[int]]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        tokens = fn(tokens)
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-text")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = EngineConfig(model=str(resolve_model(args.model)), max_running_seqs=args.rows)
    loaded = load(cfg)
    family = loaded.family
    model = family.model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(40, 600, (args.rows, args.context), generator=g)

    runner = ModelRunner(family, batch_capacity(cfg.max_running_seqs, loaded.info.max_model_len))  # as the engine's
    first: list[int] = []
    for s in range(0, args.rows, GROUP):
        prompts = [family.prompt(EngineRequest(f"r{r}", ids[r].tolist())) for r in range(s, min(s + GROUP, args.rows))]
        first += runner.prefill(list(range(s, s + len(prompts))), prompts).argmax(-1).tolist()

    cache = DynamicCache()
    hf_first: list[int] = []
    for s in range(0, args.rows, GROUP):
        part = DynamicCache()
        logits = model(input_ids=ids[s:s + GROUP], past_key_values=part, use_cache=True).logits[:, -1]
        hf_first += logits.argmax(-1).tolist()
        if s == 0:
            cache = part
        else:
            for la, lb in zip(cache.layers, part.layers, strict=True):
                la.keys, la.values = torch.cat([la.keys, lb.keys]), torch.cat([la.values, lb.values])

    def ours(tokens: list[int]) -> list[int]:
        return runner.decode(tokens).argmax(-1).tolist()

    def hf(tokens: list[int]) -> list[int]:
        out = model(input_ids=torch.tensor(tokens)[:, None], past_key_values=cache, use_cache=True)
        return out.logits[:, -1].argmax(-1).tolist()

    median_step(ours, first, 2)  # warm-up
    median_step(hf, hf_first, 2)
    mine, base = [], []
    for _ in range(args.repeats):
        mine.append(median_step(ours, first, args.steps)[0] * 1e3)
        base.append(median_step(hf, hf_first, args.steps)[0] * 1e3)
    report(f"{args.model}: decode step {args.rows} rows x {args.context} context vs HF unpadded", mine, base, "ms")


if __name__ == "__main__":
    main()
