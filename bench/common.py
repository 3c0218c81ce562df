"""What the bench scripts share: their command line (the docstring as help, --model, --repeats, --quick), their
inputs (prompts of ordinary token IDs, a noise picture), HF's static batch as a baseline, the median call, the
sides of an A/B measured in turns, and how a figure is printed beside its baseline: median [min..max] over the
repeats of one run and their ratio per repeat."""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import torch


class BenchParser(argparse.ArgumentParser):
    """An ArgumentParser whose `--quick` sets the smallest settings that still run every path of the script (a
    fast look, or a check that it runs); options given explicitly win over them."""

    def __init__(self, doc: str, quick: Mapping[str, object]) -> None:
        super().__init__(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        self.quick = dict(quick)
        spelled = " ".join(f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                           for k, v in self.quick.items())
        self.add_argument("--quick", action="store_true", help=f"the smallest settings: {spelled}")

    def parse_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None):  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        if "--quick" in argv:
            self.set_defaults(**self.quick)
        return super().parse_args(argv, namespace)


def bench_parser(doc: str, *, quick: Mapping[str, object], model: str | None = "tiny-text",
                 repeats: int | None = 3, **options: int | float | str | list) -> BenchParser:
    """The parser every bench script starts from: --model and --repeats (None: the script takes no such option), and
    one option per keyword of `options` (rows=64: `--rows`, an int defaulting to 64; a list: one or more values)."""
    parser = BenchParser(doc, quick)
    if model is not None:
        parser.add_argument("--model", default=model, help="a tiny model's name, a folder or an HF id")
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats, help="measurements of each side")
    for name, default in options.items():
        many = isinstance(default, list)
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default[0] if many else default),
                            nargs="+" if many else None, default=default)
    return parser


# -- inputs ---------------------------------------------------------------------------------------------------------

def prompts(n: int, seed: int = 0, lengths: tuple[int, int] = (16, 64)) -> list[list[int]]:
    """`n` prompts of ordinary token IDs (40..599: no special tokens in the tiny or the real vocabularies), each
    `lengths[0]`..`lengths[1]` long, the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    low, high = lengths
    return [torch.randint(40, 600, (int(torch.randint(low, high + 1, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def png(seed: int = 0, size: int = 224) -> bytes:
    """A `size` x `size` PNG of random pixels (nothing for a codec to shorten)."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@torch.inference_mode()
def hf_generate(model, batch: list[list[int]], new_tokens: int) -> int:
    """HF's static batching: one left-padded greedy `generate` of every prompt for exactly `new_tokens` tokens;
    returns the tokens generated."""
    longest = max(map(len, batch))
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in batch])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, pad_token_id=0)
    return (out.shape[1] - longest) * len(batch)


# -- timing ---------------------------------------------------------------------------------------------------------

def prefill(runner, prompts: list) -> torch.Tensor:
    """Whole prompts (engine/models Prompt) joining an engine/model_runner.py ModelRunner's batch, its rows not moving
    -> their first logits [len(prompts), vocab], in the order their rows joined (the prompts' order, as long as no
    prompt is chunked beside padded ones); `runner.execute(tokens, [])` then decodes every row in that order."""
    from engine.model_runner import PromptPart

    return runner.execute([], [PromptPart(p, 0, len(p.token_ids)) for p in prompts]).logits


def median_call(fn: Callable[[], object], n: int) -> float:
    """Median seconds of `n` calls of `fn`."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _order(names: list[str], k: int) -> list[str]:
    """Repeat k's order: as given, reversed every other repeat, so a load that drifts during a run favours no side."""
    return names if k % 2 == 0 else names[::-1]


def in_turns(sides: Mapping[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Each repeat measures every side once, in turns (see `_order`); side -> its figure per repeat."""
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for k in range(repeats):
        for name in _order(list(sides), k):
            figures[name].append(sides[name]())
    return figures


async def in_turns_async(sides: Mapping[str, Callable[[], Awaitable[float]]], repeats: int) -> dict[str, list[float]]:
    """`in_turns` for sides measured on an event loop."""
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for k in range(repeats):
        for name in _order(list(sides), k):
            figures[name].append(await sides[name]())
    return figures


# -- printing -------------------------------------------------------------------------------------------------------

def spread(values: Sequence[float]) -> str:
    """median [min..max]"""
    return f"{statistics.median(values):.4g} [{min(values):.4g}..{max(values):.4g}]"


def report(what: str, ours: Sequence[float], base: Sequence[float], unit: str) -> float:
    """Prints one figure beside its baseline, both measured in the same repeats (`in_turns`): each as median
    [min..max], and the ratio taken per repeat (ours[i] / base[i]) and printed as median [min..max] of those
    ratios, so a slow repeat does not pair its figure with another repeat's baseline. Returns the median ratio."""
    ratios = [o / b for o, b in zip(ours, base, strict=True)]
    ratio = statistics.median(ratios)
    print(f"{what}: ours {spread(ours)} {unit} | baseline {spread(base)} {unit} | ours/base per repeat "
          f"{spread(ratios)} (n={len(ours)})", flush=True)
    return ratio
