"""One in-process decode step of ROWS rows x CONTEXT cached positions: the engine's runner vs HF's own unpadded step
(the model's forward on a DynamicCache of the same prompts, no attention mask), measured in turns.

    python -m bench.decode_step [--model tiny-text] [--rows 64] [--context 1024] [--steps 10] [--repeats 5] [--quick]

Every row's prompt has CONTEXT positions (nothing is padded), so both do the same arithmetic; each repeat times
`steps` greedy steps of each and takes the median step; the ratio is taken per repeat.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from transformers import DynamicCache

from app.models import resolve_model
from bench.common import bench_parser, in_turns, median_call, prefill, prompts, report
from engine.config import EngineConfig
from engine.loader import load
from engine.model_runner import ModelRunner, batch_capacity
from splice.engine_request import EngineRequest

GROUP = 8  # prompts prefilled per forward, to bound prefill memory


@torch.inference_mode()
def main() -> None:
    args = bench_parser(__doc__, quick={"rows": 4, "context": 32, "steps": 2, "repeats": 1}, repeats=5, rows=64,
                        context=1024, steps=10).parse_args()
    torch.set_num_threads(1)
    cfg = EngineConfig(model=str(resolve_model(args.model)), max_running_seqs=args.rows)
    loaded = load(cfg)
    family = loaded.family
    model = family.model
    ids = torch.tensor(prompts(args.rows, lengths=(args.context, args.context)))

    runner = ModelRunner(family, batch_capacity(cfg.max_running_seqs, loaded.info.max_model_len))  # as the engine's
    first: list[int] = []
    for s in range(0, args.rows, GROUP):
        batch = [family.prompt(EngineRequest(f"r{r}", ids[r].tolist())) for r in range(s, min(s + GROUP, args.rows))]
        first += prefill(runner, batch).argmax(-1).tolist()

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

    tokens = {"ours": first, "hf": hf_first}  # each side's last greedy tokens, fed to its next step

    def ours() -> None:
        tokens["ours"] = runner.execute(tokens["ours"], []).logits.argmax(-1).tolist()

    def hf() -> None:
        out = model(input_ids=torch.tensor(tokens["hf"])[:, None], past_key_values=cache, use_cache=True)
        tokens["hf"] = out.logits[:, -1].argmax(-1).tolist()

    sides = {"ours": lambda: median_call(ours, args.steps) * 1e3, "hf": lambda: median_call(hf, args.steps) * 1e3}
    in_turns(sides, 1)  # warm-up
    ms = in_turns(sides, args.repeats)
    report(f"{args.model}: decode step {args.rows} rows x {args.context} context vs HF unpadded", ms["ours"], ms["hf"],
           "ms")


if __name__ == "__main__":
    main()
