"""tiny-llava-onevision: a SigLIP tower, any-resolution crops and a Qwen2 decoder (engine/models/llava_onevision.py)."""

from __future__ import annotations

from pathlib import Path

from app.tiny import templates
from app.tiny.families.common import VISION, text_config_kwargs
from app.tiny.tokenizer import build_tokenizer
from preprocessor.processor_parts import save_without_missing_parts, without_missing_parts

# llava-onevision-qwen2: 151646 tokens in a 152000-row table; the tiny keeps that headroom, rounded to 64.
ONEVISION_HEADROOM = 354


def build_llava_onevision(out: Path) -> None:
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessorPil,
        LlavaOnevisionProcessor,
        Qwen2Config,
        SiglipVisionConfig,
    )

    tok = build_tokenizer(["<image>", "<video>"], templates.LLAVA_ONEVISION)
    side = VISION["image_size"]
    # Any-resolution crops of up to 2x2 tiles (the real model: up to 6x6 of 384 px). anyres_max_1 (real: 9)
    # makes a 2x2 grid take HF's bilinear downscale of the unpadded features, which the real grid reaches.
    pinpoints = [[side, side], [side, 2 * side], [2 * side, side], [2 * side, 2 * side]]
    aspect = "anyres_max_1"
    vocab_size = -(-(len(tok) + ONEVISION_HEADROOM) // 64) * 64
    config = LlavaOnevisionConfig(
        vision_config=SiglipVisionConfig(**VISION, vision_use_head=False),
        text_config=Qwen2Config(**dict(text_config_kwargs(tok), vocab_size=vocab_size)),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        vision_feature_select_strategy="full",  # SigLIP has no CLS position
        vision_feature_layer=-1,
        image_grid_pinpoints=pinpoints,
        vision_aspect_ratio=aspect,
        tie_word_embeddings=False,
    )
    model = LlavaOnevisionForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    image_processor = LlavaOnevisionImageProcessorPil(size={"height": side, "width": side},
                                                      image_grid_pinpoints=pinpoints, image_mean=[0.5] * 3,
                                                      image_std=[0.5] * 3)
    # No video processor: it needs torchvision (preprocessor/processor_parts.py)
    processor = without_missing_parts(LlavaOnevisionProcessor)(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=None,
        num_image_tokens=(side // VISION["patch_size"]) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio=aspect,
        chat_template=templates.LLAVA_ONEVISION,
    )
    assert len(processor.tokenizer) < config.text_config.vocab_size, "no headroom"
    model.save_pretrained(out)
    save_without_missing_parts(processor, out)
