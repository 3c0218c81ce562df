"""Row 5: time to first token added by the two gRPC hops at concurrency 1: the whole stack (client ->
preprocessor -> engine processes) vs the same preprocessor core calling an in-process engine directly, one
request after the other, alternating.

    python -m bench.ttft_hops [--model tiny-text] [--repeats 20]

A vision model's request carries one 224x224 image; a text model's is one short user message. Both sides
normalize (template, tokenization, image processing) and prefill the same request; the difference is the hops.
Beside each pair it times one call through two nested gRPC hops that do no work (bench.wire_floor): the wire's
floor under what the hops add.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from PIL import Image

from app.launch import start_stack
from app.models import resolve_model
from bench.wire_floor import Floor
from clients import AsyncSpliceClient, image_part, text_part
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from preprocessor.content import Conversation, Message, Text, Where
from preprocessor.content import Image as ImagePart
from preprocessor.core import PreprocessorCore
from preprocessor.model_files import load_model_files
from splice.sampling import SamplingParams


def png(seed: int = 0) -> bytes:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (224, 224, 3), generator=g, dtype=torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-text")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
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
    stack, pre = start_stack(args.model)
    floor = Floor()
    try:
        async with AsyncSpliceClient(pre.address, timeout=120) as client:
            async def hops() -> float:
                start = time.perf_counter()
                async for _ in client.chat([{"role": "user", "content": content}], temperature=0.0, max_tokens=1):
                    return time.perf_counter() - start
                raise RuntimeError("no chunk")

            async def direct() -> float:
                start = time.perf_counter()
                async for _ in core.chat(conv, sampling):
                    return time.perf_counter() - start
                raise RuntimeError("no chunk")

            for _ in range(3):
                await hops()
                await direct()
                await floor.call()
            ours, base, wire = [], [], []
            for _ in range(args.repeats):
                ours.append(await hops() * 1e3)
                base.append(await direct() * 1e3)
                wire.append(await floor.call() * 1e3)
        added = [a - b for a, b in zip(ours, base, strict=True)]
        print(f"{args.model}: TTFT through both hops {statistics.median(ours):.2f} ms vs in-process "
              f"{statistics.median(base):.2f} ms; added by the hops: median {statistics.median(added):.2f} ms "
              f"[{min(added):.2f}..{max(added):.2f}] (n={len(added)}); the wire's floor (two nested hops doing "
              f"nothing): {statistics.median(wire):.2f} ms [{min(wire):.2f}..{max(wire):.2f}]", flush=True)
    finally:
        await floor.close()
        pre.stop()
        stack.stop()
        engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
