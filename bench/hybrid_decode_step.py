"""Step time of a 16-row decode batch: the hybrid tiny models against the attention-only tiny-text, one run.

    python -m bench.hybrid_decode_step [--rows 16] [--steps 20] [--repeats 5]

Each repeat, for each model in turn (interleaved, so drift hits all alike): a fresh runner prefills `rows`
prompts of different lengths (left-padded together), then `steps` greedy decode steps are timed one by one;
the repeat's figure is the median step, the model's figure the median over repeats. The ratio is against
tiny-text; the per-layer ratio divides out the depth (tiny-text has 2 layers, the hybrids 4).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.models import resolve_model
from engine.config import EngineConfig
from engine.loader import load
from engine.model_runner import ModelRunner
from splice.engine_request import EngineRequest

MODELS = ("tiny-text", "tiny-qwen3.5", "tiny-lfm2-vl")


def prompts(family, rows: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(rows):
        n = int(torch.randint(16, 65, (1,), generator=g))
        ids = torch.randint(40, 600, (n,), generator=g).tolist()  # ordinary text tokens, no specials
        out.append(family.prompt(EngineRequest(f"p{k}", ids)))
    return out


def step_times(family, batch: list, steps: int) -> float:
    """Median seconds of one decode step over `rows` rows, after a fresh prefill."""
    runner = ModelRunner(family)
    tokens = runner.prefill(list(range(len(batch))), batch).argmax(-1).tolist()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        tokens = runner.decode(tokens).argmax(-1).tolist()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    families = {m: load(EngineConfig(model=str(resolve_model(m)))).family for m in MODELS}
    batches = {m: prompts(f, args.rows) for m, f in families.items()}
    for m, f in families.items():  # warm-up: allocations and first-call paths
        step_times(f, batches[m], 3)
    seen: dict[str, list[float]] = {m: [] for m in MODELS}
    with torch.inference_mode():
        for _ in range(args.repeats):
            for m, f in families.items():
                seen[m].append(step_times(f, batches[m], args.steps))
    base = statistics.median(seen["tiny-text"])
    base_layers = families["tiny-text"].text_config.num_hidden_layers
    print(f"decode step, {args.rows} rows, median of {args.repeats} repeats x {args.steps} steps, "
          f"{torch.get_num_threads()} thread(s)")
    print(f"{'model':<14} {'layers':<38} {'ms/step':>8} {'vs text':>8} {'per layer':>10}")
    for m, f in families.items():
        tc = f.text_config
        kinds = getattr(tc, "layer_types", None) or ["full_attention"] * tc.num_hidden_layers
        med = statistics.median(seen[m])
        per_layer = (med / tc.num_hidden_layers) / (base / base_layers)
        print(f"{m:<14} {','.join(k.replace('_attention', '') for k in kinds):<38} {med * 1e3:8.2f} "
              f"{med / base:8.2f} {per_layer:10.2f}")


if __name__ == "__main__":
    main()
