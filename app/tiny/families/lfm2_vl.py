"""tiny-lfm2-vl (engine/models/lfm2_vl.py)."""

from __future__ import annotations

from pathlib import Path

from app.tiny import templates
from app.tiny.families.common import TEXT, padded_vocab
from app.tiny.tokenizer import build_tokenizer

LFM2_VL_SPECIALS = (["<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]
                    + [f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5)])


def build_lfm2_vl(out: Path) -> None:
    """LFM2-VL: short convolution and attention layers in turn, a SigLIP2 (NaFlex) tower on 32 px tiles plus a
    thumbnail, pixel-unshuffled 2x2; vocab_size padded above the tokenizer, as LFM2's 65536 rows are."""
    from transformers import (
        Lfm2Config,
        Lfm2VlConfig,
        Lfm2VlForConditionalGeneration,
        Lfm2VlProcessor,
        Siglip2VisionConfig,
    )

    # transformers' LFM2-VL image processor needs torchvision: Splice's PIL one makes the same tensors
    from preprocessor.pil_image_processors import Lfm2VlImageProcessorPil

    tok = build_tokenizer(LFM2_VL_SPECIALS, templates.LFM2_VL)
    patch, tile = 4, 32
    text = Lfm2Config(
        vocab_size=padded_vocab(tok),
        hidden_size=TEXT["hidden_size"],
        intermediate_size=TEXT["intermediate_size"],
        block_auto_adjust_ff_dim=False,
        num_hidden_layers=4,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        num_attention_heads=TEXT["num_attention_heads"],
        num_key_value_heads=TEXT["num_key_value_heads"],
        max_position_embeddings=TEXT["max_position_embeddings"],
        norm_eps=TEXT["rms_norm_eps"],
        conv_L_cache=3,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    vision = Siglip2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 patch_size=patch, num_patches=(tile // patch) ** 2)
    config = Lfm2VlConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        projector_hidden_size=64,
        downsample_factor=2,
        tie_word_embeddings=True,
    )
    model = Lfm2VlForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    # Up to 16 tokens (64 patches) per image or tile; larger images split into 2..4 tiles of 32 px + thumbnail
    image_processor = Lfm2VlImageProcessorPil(encoder_patch_size=patch, tile_size=tile, downsample_factor=2,
                                              min_image_tokens=4, max_image_tokens=16, min_tiles=2, max_tiles=4)
    processor = Lfm2VlProcessor(image_processor=image_processor, tokenizer=tok, chat_template=templates.LFM2_VL)
    model.save_pretrained(out)
    processor.save_pretrained(out)
