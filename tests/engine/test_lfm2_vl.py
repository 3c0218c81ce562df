"""LFM2-VL: Splice's PIL image processor (transformers has only a torchvision one) makes the tiles, tokens and
patch layout the model expects."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from engine.config import EngineConfig
from engine.loader import load
from tests.engine.engine_factories import picture
from tests.engine.family_cases import chat_prompt, hf_processor


@pytest.fixture(scope="module")
def lfm2(tiny_dirs):
    folder = tiny_dirs["tiny-lfm2-vl"]
    return load(EngineConfig(model=str(folder))).family, hf_processor(folder)


@pytest.mark.parametrize("size", [(20, 20), (70, 45), (200, 30), (33, 97), (64, 64)])
def test_image_tokens_equal_the_towers_feature_rows(lfm2, size):
    family, processor = lfm2
    out = processor(text=chat_prompt(processor, "What?", 1), images=[picture(*size)], return_tensors="pt")
    inputs = {k: out[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes")}
    tokens = int((out["input_ids"] == family.image_token_id).sum())
    assert family.images.expected_rows(inputs) == tokens
    with torch.inference_mode():
        assert family.image_features(inputs).shape == (tokens, family.text_config.hidden_size)


def test_a_large_image_is_a_tile_grid_plus_a_thumbnail(lfm2):
    _, processor = lfm2
    ip = processor.image_processor
    out = ip([picture(70, 45)], return_tensors="pt", return_row_col_info=True)
    rows, cols = int(out["image_rows"][0]), int(out["image_cols"][0])
    side = ip.tile_size // ip.encoder_patch_size
    assert rows * cols >= ip.min_tiles and out["spatial_shapes"].shape[0] == rows * cols + 1
    assert out["spatial_shapes"][:-1].tolist() == [[side, side]] * (rows * cols)
    h, w = out["spatial_shapes"][-1].tolist()  # the thumbnail: the whole image in at most max_image_tokens
    assert h * w <= ip.max_image_tokens * ip.downsample_factor**2 and out["pixel_attention_mask"][-1].sum() == h * w


def test_patches_are_row_major_blocks_of_the_normalized_image(lfm2):
    _, processor = lfm2
    ip = processor.image_processor
    pic = picture(20, 20)  # small: one tile, resized (never split)
    out = ip([pic], return_tensors="np", return_row_col_info=True)
    h, w = out["image_sizes"][0]
    p = ip.encoder_patch_size
    pixels = np.asarray(pic.resize((w, h), Image.BILINEAR), dtype=np.float32) / 255  # [h, w, c]
    pixels = (pixels - np.array(ip.image_mean)) / np.array(ip.image_std)
    want = [pixels[i * p:(i + 1) * p, j * p:(j + 1) * p].reshape(-1) for i in range(h // p) for j in range(w // p)]
    got = out["pixel_values"][0, :len(want)]
    np.testing.assert_allclose(got, np.stack(want), atol=1e-5)
    assert out["pixel_attention_mask"][0].sum() == len(want)
