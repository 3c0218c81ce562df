"""The engine's runner with Splice's own text-stack forward (`--model-impl splice`, engine/models/lean_llama.py) vs
the same runner calling transformers' modules (`--model-impl transformers`), measured in turns in one run, on
three kinds of step:

    python -m bench.lean_forward [--model tiny-text] [--rows 64] [--context 128] [--steps 20] [--repeats 7] [--quick]

- decode: one decode step of ROWS rows x CONTEXT cached positions;
- mixed: one packed step, every row decoding while one CONTEXT-token prompt is prefilled;
- prefill: one left-padded prefill of 8 prompts of about CONTEXT tokens.

Both load the same checkpoint; each repeat times `steps` calls of each, in turns, and takes the median call; ratios
are per repeat. The logits of the two are compared too (they are bit-identical on CPU: the same ops in the same
order).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.models import resolve_model
from bench.common import bench_parser, in_turns, median_call, prefill, prompts, report
from engine.config import EngineConfig
from engine.loader import load
from engine.model_runner import ModelRunner, PromptPart
from splice.engine_request import EngineRequest

GROUP = 8  # prompts prefilled per forward


class Side:
    """One runner with ROWS rows of CONTEXT positions, on one model_impl."""

    def __init__(self, folder: str, impl: str, ids: torch.Tensor) -> None:
        self.family = load(EngineConfig(model=folder, model_impl=impl)).family
        assert self.family.impl == ("transformers" if impl == "transformers" else "splice"), self.family.impl
        self.ids = ids
        self.runner = ModelRunner(self.family)
        self.first: list[int] = []
        for s in range(0, len(ids), GROUP):
            batch = self.prompts(range(s, min(s + GROUP, len(ids))))
            self.first += prefill(self.runner, batch).argmax(-1).tolist()
        self.tokens = list(self.first)
        self.arrival = self.prompts([0])[0]

    def prompts(self, rows) -> list:
        return [self.family.prompt(EngineRequest(f"r{r}", self.ids[r].tolist())) for r in rows]

    def decode(self) -> torch.Tensor:
        logits = self.runner.execute(self.tokens, []).logits
        self.tokens = logits.argmax(-1).tolist()
        return logits

    def mixed(self) -> torch.Tensor:
        """A packed step with one arrival, which then leaves again (so every call is the same step)."""
        n = len(self.tokens)
        out = self.runner.execute(self.tokens, [PromptPart(self.arrival, 0, len(self.arrival.token_ids))])
        assert out.packed
        self.runner.remove([n])  # (its slot: the one after the rows)
        rows = out.logits[:n]
        self.tokens = rows.argmax(-1).tolist()
        return rows

    def prefill(self) -> torch.Tensor:
        """A group prefill of GROUP prompts (left-padded: their lengths differ) into a runner of its own."""
        batch = [self.family.prompt(EngineRequest(f"p{r}", self.ids[r, :len(self.ids[r]) - r].tolist()))
                 for r in range(GROUP)]
        return prefill(ModelRunner(self.family), batch)


@torch.inference_mode()
def main() -> None:
    args = bench_parser(__doc__, quick={"rows": 8, "context": 32, "steps": 2, "repeats": 1}, repeats=7, rows=64,
                        context=128, steps=20).parse_args()
    torch.set_num_threads(1)
    folder = str(resolve_model(args.model))
    ids = torch.tensor(prompts(args.rows, lengths=(args.context, args.context)))
    lean, hf = Side(folder, "splice", ids), Side(folder, "transformers", ids)
    assert lean.first == hf.first
    for what in ("decode", "mixed", "prefill"):
        a, b = getattr(lean, what), getattr(hf, what)
        same = torch.equal(a(), b())  # also the warm-up
        ms = in_turns({"lean": lambda a=a: median_call(a, args.steps) * 1e3,
                       "transformers": lambda b=b: median_call(b, args.steps) * 1e3}, args.repeats)
        report(f"{args.model}: {what} ({args.rows} rows x {args.context} context), lean vs transformers' modules, "
               f"logits identical: {same}", ms["lean"], ms["transformers"], "ms")


if __name__ == "__main__":
    main()
