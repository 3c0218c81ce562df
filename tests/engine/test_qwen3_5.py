"""Qwen3.5: M-RoPE positions as HF computes them, and that they matter."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.loader import load
from splice.engine_request import EngineRequest, NamedTensor
from tests.engine.engine_factories import picture
from tests.engine.family_cases import chat_prompt, hf_processor
from tests.engine.runner_rows import Rows


@pytest.fixture(scope="module")
def qwen(tiny_dirs):
    folder = tiny_dirs["tiny-qwen3.5"]
    processor = hf_processor(folder)
    pics = [picture(70, 45), picture(30, 60, shift=9)]  # two grids: 6x8 and 8x4 patches
    out = processor(text=chat_prompt(processor, "Compare them.", 2), images=pics, return_tensors="pt")
    return load(EngineConfig(model=str(folder))).family, out


def _request(out) -> EngineRequest:
    tensors = [NamedTensor(k, out[k]) for k in ("pixel_values", "image_grid_thw")]
    return EngineRequest("q", out["input_ids"][0].tolist(), tensors=tensors)


def test_prompt_positions_equal_hfs_rope_index_and_decode_continues_from_max_plus_one(qwen):
    family, out = qwen
    prompt = family.prompt(_request(out))
    want, delta = family.model.model.get_rope_index(out["input_ids"], out["mm_token_type_ids"],
                                                    image_grid_thw=out["image_grid_thw"])  # [3, 1, P], [1, 1]
    assert torch.equal(prompt.positions, want[:, 0])
    # HF decodes at cache length + delta = P + delta: the engine's next position
    assert prompt.next_position == len(prompt.token_ids) + int(delta) < len(prompt.token_ids)


def test_image_positions_change_the_logits(qwen):
    family, out = qwen
    prompt = family.prompt(_request(out))
    flat = torch.arange(len(prompt.token_ids))[None].expand(3, -1)  # what 1-D RoPE would use
    assert not torch.equal(prompt.positions, flat)
    m_rope = Rows(family).prefill([0], [prompt])
    prompt.positions = flat
    one_d = Rows(family).prefill([0], [prompt])
    assert (m_rope - one_d).abs().max() > 1e-4
