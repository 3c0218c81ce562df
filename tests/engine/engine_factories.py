"""Builders shared by the engine tests: requests, images, solo references. Real models, no mocks."""

from __future__ import annotations

import asyncio

import torch
from PIL import Image

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from splice.engine_output import EngineOutput
from splice.engine_request import PROMPT_EMBEDS, EmbedSpan, EngineRequest, NamedTensor
from splice.sampling import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


def start_engine(folder, **limits) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(folder), **limits))
    engine.start()
    return engine


def picture(w: int, h: int, shift: int = 0) -> Image.Image:
    pixels = bytes((x * 7 + y * 3 + c * 50 + shift) % 256 for y in range(h) for x in range(w) for c in range(3))
    return Image.frombytes("RGB", (w, h), pixels)


def random_ids(n: int, seed: int, low: int = 10, high: int = 300) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n,), generator=g).tolist()


def text_request(ids: list[int], request_id: str = "r", **sampling) -> EngineRequest:
    return EngineRequest(request_id, list(ids), sampling=SamplingParams(**{**GREEDY, **sampling}))


def image_inputs(model_dir, prompt_text: str = "What is shown?", size=(70, 45)) -> tuple[list[int], dict]:
    """(input_ids, {forward keyword: tensor}) exactly as the model's own HF processor makes them."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir, backend="pil")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt_text}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=prompt, images=[picture(*size)], return_tensors="pt")
    tensors = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask", "token_type_ids")}
    return inputs.input_ids[0].tolist(), tensors


def with_embed_span(ids: list[int], tensors: dict, at: int, rows: torch.Tensor, request_id: str = "mixed",
                    **sampling) -> EngineRequest:
    """Inserts len(rows) filler positions at `at`, supplied by `rows` [n, hidden]."""
    n = rows.shape[0]
    token_ids = ids[:at] + [0] * n + ids[at:]
    named = [NamedTensor(PROMPT_EMBEDS, rows)] + [NamedTensor(k, v) for k, v in tensors.items()]
    return EngineRequest(request_id, token_ids, [EmbedSpan(at, n, 0)], named,
                         SamplingParams(**{**GREEDY, **sampling}))


async def collect(engine: LLMEngine, req: EngineRequest) -> tuple[list[int], list[EngineOutput]]:
    outs = [out async for out in engine.generate(req)]
    return [t for o in outs for t in o.token_ids], outs


async def wait_until(predicate, what: str) -> None:
    """Until `predicate()` holds (polled every 5 ms; a hang guard after a minute, not a timing assertion)."""
    for _ in range(12000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")
