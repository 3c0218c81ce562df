"""Step time of a 16-row decode batch: the hybrid tiny models (recurrent layers beside attention) against the
attention-only tiny-text, one run: what a hybrid family's recurrent state costs per layer.

    python -m bench.experiments.hybrid_decode_step [--rows 16] [--steps 20] [--repeats 5] [--quick]

Each repeat, for each model in turn (bench.common.in_turns, so drift hits all alike): a fresh runner prefills `rows`
prompts of 16-64 ordinary token IDs (left-padded together), then `steps` greedy decode steps are timed one by one;
the repeat's figure is the median step, the model's figure the median over repeats. The ratio is against
tiny-text; the per-layer ratio divides out the depth (tiny-text has 2 layers, the hybrids 4).
"""

from __future__ import annotations

import os
import statistics

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.models import resolve_model
from bench.common import bench_parser, in_turns, median_call, prefill, prompts
from engine.config import EngineConfig
from engine.loader import load
from engine.model_runner import ModelRunner
from splice.engine_request import EngineRequest

MODELS = ("tiny-text", "tiny-qwen3.5", "tiny-lfm2-vl")


def step_times(family, rows: int, steps: int) -> float:
    """Median seconds of one decode step over `rows` rows, after a fresh prefill."""
    batch = [family.prompt(EngineRequest(f"p{k}", ids)) for k, ids in enumerate(prompts(rows))]
    runner = ModelRunner(family)
    tokens = prefill(runner, batch).argmax(-1).tolist()

    def step() -> None:
        nonlocal tokens
        tokens = runner.execute(tokens, []).logits.argmax(-1).tolist()

    return median_call(step, steps)


def main() -> None:
    args = bench_parser(__doc__, quick={"rows": 2, "steps": 2, "repeats": 1}, model=None, repeats=5, rows=16,
                        steps=20).parse_args()
    torch.set_num_threads(1)
    families = {m: load(EngineConfig(model=str(resolve_model(m)))).family for m in MODELS}

    def sides(steps: int) -> dict:
        return {m: lambda f=f: step_times(f, args.rows, steps) for m, f in families.items()}

    with torch.inference_mode():
        in_turns(sides(3), 1)  # warm-up: allocations and first-call paths
        seen = in_turns(sides(args.steps), args.repeats)
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
