"""tiny-llava: a CLIP tower and a Llama decoder (engine/models/llava.py)."""

from __future__ import annotations

from pathlib import Path

from app.tiny import templates
from app.tiny.families.common import VISION, text_config_kwargs
from app.tiny.tokenizer import build_tokenizer


def build_llava(out: Path) -> None:
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = build_tokenizer(["<image>"], templates.LLAVA)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**VISION, projection_dim=32),
        text_config=LlamaConfig(**text_config_kwargs(tok)),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        image_seq_length=(VISION["image_size"] // VISION["patch_size"]) ** 2,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlavaForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    side = VISION["image_size"]
    # The PIL image processors throughout: the default (torchvision) ones would need torchvision to build.
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=VISION["patch_size"],
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS position, dropped by the "default" strategy
        chat_template=templates.LLAVA,
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)
