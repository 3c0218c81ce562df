"""LoRA serving against vLLM on the same base and adapters (built-in, untrained: app/loras.py), whole stacks over HTTP:

(a) the same greedy chat requests under an adapter (and under the base) to both: equal text, and each token's
    logprob within 1e-4 (the largest difference printed);
(b) cost: --streams concurrent streams split over --adapters adapters vs the same streams on the base model, time per
    output token (each stream's time between its first and its last token over its tokens after the first; the
    median stream), both sides in turns, the ratio per repeat; the same on vLLM, its own ratio beside.

Needs vLLM in its own virtual environment (--vllm-venv; never a dependency of Splice), so it is not part of CI. Both
serve --model in float32 with a 2048-token context, --enable-lora --max-loras N --max-cpu-loras N --max-lora-rank R
and one running slot per stream; vLLM's first start on a CPU compiles for ~2 minutes.

    .venv/bin/python -m bench.lora --vllm-venv PATH-TO-A-VLLM-VENV
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai

from app.loras import LORA_BASES, ensure_lora
from app.models import resolve_model
from bench.common import bench_parser, spread
from bench.stacks import running_stack
from bench.vllm_server import check_venv, vllm_server

PROMPTS = ["What is the capital of France?", "Name three primary colors.", "Write a haiku about the sea.",
           "Give me one tip for learning Python.", "Who wrote Romeo and Juliet?", "What is 12 plus 30?"]
TOLERANCE = 1e-4


def answers(url: str, model: str, new_tokens: int) -> list[tuple[str, list[float]]]:
    """(text, chosen-token logprobs) of each greedy chat in PROMPTS under `model` (a base or an adapter name)."""
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    out = []
    for prompt in PROMPTS:
        r = api.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                        temperature=0.0, max_tokens=new_tokens, logprobs=True)
        out.append((r.choices[0].message.content, [t.logprob for t in r.choices[0].logprobs.content]))
    return out


async def _stream(api: openai.AsyncOpenAI, model: str, k: int, new_tokens: int) -> float:
    """One streamed completion's time per output token after its first."""
    times = []
    stream = await api.completions.create(model=model, prompt=f"Story number {k}: once upon a time", stream=True,
                                          temperature=0.0, max_tokens=new_tokens, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
    return (times[-1] - times[0]) / max(1, len(times) - 1)


async def tpot(url: str, models: list[str], new_tokens: int) -> float:
    """The median stream's time per output token, stream i under models[i] (all at once)."""
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600) as api:
        per = sorted(await asyncio.gather(*(_stream(api, m, k, new_tokens) for k, m in enumerate(models))))
    return per[len(per) // 2]


def cost(url: str, base: str, adapters: list[str], streams: int, new_tokens: int, repeats: int) -> tuple[list, list]:
    """(base TPOTs, adapters' TPOTs) per repeat, in turns (order reversed every other repeat)."""
    split = [adapters[k % len(adapters)] for k in range(streams)]
    asyncio.run(tpot(url, split, 4))  # warm: every adapter read and every path run once
    on_base, on_loras = [], []
    for r in range(repeats):
        for side in (("base", "lora") if r % 2 == 0 else ("lora", "base")):
            if side == "base":
                on_base.append(asyncio.run(tpot(url, [base] * streams, new_tokens)))
            else:
                on_loras.append(asyncio.run(tpot(url, split, new_tokens)))
    return on_base, on_loras


def compare(splice: list, vllm: list, what: str) -> bool:
    same_text = all(a[0] == b[0] for a, b in zip(splice, vllm, strict=True))
    diffs = [abs(x - y) for a, b in zip(splice, vllm, strict=True) for x, y in zip(a[1], b[1], strict=False)]
    worst = max(diffs, default=0.0)
    print(f"{what}: greedy text equal on {sum(a[0] == b[0] for a, b in zip(splice, vllm, strict=True))}/"
          f"{len(PROMPTS)} prompts; chosen-token logprobs max |diff| {worst:.2e} (within {TOLERANCE:g}: "
          f"{'yes' if worst <= TOLERANCE else 'NO'})", flush=True)
    for (text_a, _), (text_b, _) in zip(splice, vllm, strict=True):
        if text_a != text_b:
            print(f"  Splice: {text_a!r}\n  vLLM:   {text_b!r}")
    return same_text and worst <= TOLERANCE


def main() -> int:
    parser = bench_parser(__doc__, quick={"streams": 4, "new_tokens": 8, "repeats": 1},
                          model="smollm2-135m-instruct")
    parser.add_argument("--vllm-venv", type=Path, required=True, help="vLLM's own virtual environment")
    parser.add_argument("--vllm-port", type=int, default=8011)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=4, help="adapters the streams are split over")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--answer-tokens", type=int, default=24, help="tokens of each compared greedy answer")
    parser.add_argument("--vllm-timeout", type=float, default=900.0, help="seconds vLLM may take to start")
    args = parser.parse_args()
    if args.model not in LORA_BASES:
        parser.error(f"--model must have built-in adapters: one of {sorted(LORA_BASES)}")
    folder = resolve_model(args.model)
    names = [f"{args.model}-lora{'' if k == 0 else k + 1}" for k in range(args.adapters)]
    paths = [str(ensure_lora(n)) for n in names]
    rank = LORA_BASES[args.model].r
    modules = [f"{n}={p}" for n, p in zip(names, paths, strict=True)]
    limits = ["--max-loras", str(args.adapters), "--max-cpu-loras", str(args.adapters), "--max-lora-rank", str(rank)]
    print(f"{args.model}, {args.adapters} untrained rank-{rank} adapters made with PEFT; {args.streams} streams x "
          f"{args.new_tokens} tokens; {args.repeats} repeat(s)", flush=True)
    with running_stack(args.model, http_port=0, engine_args=["--enable-lora", "--lora-modules", *modules, *limits,
                                                                "--max-running-seqs", str(args.streams)]) as (_, pre):
        splice = f"http://{pre.http_address}"
        ours = {m: answers(splice, m, args.answer_tokens) for m in (args.model, names[0])}
        splice_cost = cost(splice, args.model, names, args.streams, args.new_tokens, args.repeats)
    with vllm_server(check_venv(args.vllm_venv), folder, name=args.model, port=args.vllm_port,
                     flags=["--enable-lora", "--lora-modules", *modules, *limits, "--max-num-seqs", str(args.streams)],
                     timeout=args.vllm_timeout) as vllm:
        theirs = {m: answers(vllm, m, args.answer_tokens) for m in (args.model, names[0])}
        vllm_cost = cost(vllm, args.model, names, args.streams, args.new_tokens, args.repeats)
    ok = compare(ours[names[0]], theirs[names[0]], f"(a) under {names[0]}")
    ok &= compare(ours[args.model], theirs[args.model], "    under the base")
    print(f"(b) time per output token, {args.streams} streams: on the base vs split over {args.adapters} adapters")
    for who, (base, loras) in (("Splice", splice_cost), ("vLLM", vllm_cost)):
        ratios = [b2 / b1 for b1, b2 in zip(base, loras, strict=True)]
        print(f"  {who:6}  base {spread([x * 1e3 for x in base])} ms   adapters {spread([x * 1e3 for x in loras])} ms"
              f"   ratio {spread(ratios)}x", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
