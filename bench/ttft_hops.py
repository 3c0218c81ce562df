"""Time to first token added by the two gRPC hops at concurrency 1: the whole stack (client -> preprocessor ->
engine processes) vs the same preprocessor core calling an in-process engine directly, one request after the
other, in turns.

    python -m bench.ttft_hops [--model tiny-text] [--repeats 20] [--quick]

A vision model's request carries one 224x224 image; a text model's is one short user message. Both sides
normalize (template, tokenization, image processing) and prefill the same request; the difference is the hops.
Beside each pair it times one call through two nested gRPC hops that do no work (bench.wire_floor): the wire's
floor under what the hops add.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.models import resolve_model
from bench.common import bench_parser, in_turns_async, png
from bench.stacks import running_stack
from bench.wire_floor import Floor
from clients import AsyncSpliceClient, image_part, text_part
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from preprocessor.answer import chat
from preprocessor.content import Conversation, Message, Text, Where
from preprocessor.content import Image as ImagePart
from preprocessor.core import PreprocessorCore
from preprocessor.model_files import load_model_files
from splice.sampling import SamplingParams


async def main() -> None:
    args = bench_parser(__doc__, quick={"repeats": 2}, repeats=20).parse_args()
    torch.set_num_threads(1)
    folder = str(resolve_model(args.model))
    engine = LLMEngine(EngineConfig(model=folder))
    engine.start()
    await engine.warmup()
    core = PreprocessorCore(load_model_files(folder), engine.info, engine)
    image = png() if engine.info.image_token_id is not None else None
    sampling = SamplingParams(temperature=0.0, max_tokens=1)
    text = "Describe this in one word." if image else "Say one word about the sea."
    parts = (ImagePart("data", image, Where(0, 0)), Text(text, Where(0, 1))) if image else (Text(text, Where(0, 0)),)
    conv = Conversation((Message("user", parts, False, 0),))
    content = [image_part(image), text_part(text)] if image else [text_part(text)]
    floor = Floor()
    try:
        with running_stack(args.model) as (_, pre):
            async with AsyncSpliceClient(pre.address, timeout=120) as client:
                async def hops() -> float:
                    start = time.perf_counter()
                    async for _ in client.chat([{"role": "user", "content": content}], temperature=0.0,
                                               max_tokens=1):
                        return time.perf_counter() - start
                    raise RuntimeError("no chunk")

                async def direct() -> float:
                    start = time.perf_counter()
                    async for _ in chat(core, conv, sampling):
                        return time.perf_counter() - start
                    raise RuntimeError("no chunk")

                sides = {"hops": hops, "direct": direct, "wire": floor.call}
                await in_turns_async(sides, 3)  # warm-up
                seconds = await in_turns_async(sides, args.repeats)
    finally:
        await floor.close()
        engine.stop()
    ours, base, wire = ([t * 1e3 for t in seconds[side]] for side in ("hops", "direct", "wire"))
    added = [a - b for a, b in zip(ours, base, strict=True)]
    print(f"{args.model}: TTFT through both hops {statistics.median(ours):.2f} ms vs in-process "
          f"{statistics.median(base):.2f} ms; added by the hops: median {statistics.median(added):.2f} ms "
          f"[{min(added):.2f}..{max(added):.2f}] (n={len(added)}); the wire's floor (two nested hops doing "
          f"nothing): {statistics.median(wire):.2f} ms [{min(wire):.2f}..{max(wire):.2f}]", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
