"""SmolVLM under its own class (SmolVLMForConditionalGeneration, model_type smolvlm), served by the Idefics3
family: tiles plus a global view, each tile's rows between tags (several image-token runs per image), and
SmolVLM-256M's vocabulary situation (no headroom: a sentinel overflows the table)."""

from __future__ import annotations

import pytest
import torch

from engine.models import family_for
from engine.models.idefics3 import Idefics3
from preprocessor.model_files import load_model_files, load_processor
from tests.engine.engine_factories import picture, start_engine

TINY = "tiny-smolvlm"


@pytest.fixture(scope="module")
def engine(tiny_dirs):
    started = start_engine(tiny_dirs[TINY])
    yield started
    started.stop()


def test_served_as_smolvlm_by_the_idefics3_family(engine, tiny_dirs):
    config = engine.m.model.config
    assert type(engine.m.model).__name__ == "SmolVLMForConditionalGeneration" and config.model_type == "smolvlm"
    assert family_for(config) is Idefics3 and isinstance(engine.m.family, Idefics3)
    files = load_model_files(tiny_dirs[TINY])
    assert type(files.processor).__name__ == "SmolVLMProcessor"
    assert files.base_vocab == engine.info.vocab_rows <= min(files.sentinels.ids)  # the sentinels overflow


@pytest.mark.parametrize("size", [(70, 45), (45, 70), (32, 32), (64, 64), (5, 3), (100, 30)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_rows_equal_hf_features_and_the_processors_tokens(engine, tiny_dirs, size):
    processor = load_processor(tiny_dirs[TINY])
    content = [{"type": "image"}, {"type": "text", "text": "What is shown?"}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    out = processor(text=prompt, images=[picture(*size)], return_tensors="pt")
    tensors = {k: out[k] for k in ("pixel_values", "pixel_attention_mask")}
    with torch.inference_mode():
        feats = engine.m.model.model.get_image_features(**tensors).pooler_output
    ids = out["input_ids"][0].tolist()
    tokens = ids.count(engine.info.image_token_id)
    assert engine.m.family.images.expected_rows(tensors) == tokens == sum(f.shape[0] for f in feats)
    tiles = out["pixel_values"].shape[1]
    positions = [i for i, t in enumerate(ids) if t == engine.info.image_token_id]
    assert tiles == 1 or positions[-1] - positions[0] + 1 > tokens  # split images: one run per tile
