"""tiny-qwen3.5 (engine/models/qwen3_5.py)."""

from __future__ import annotations

from pathlib import Path

from app.tiny import templates
from app.tiny.families.common import TEXT, padded_vocab, text_config_kwargs
from app.tiny.tokenizer import build_tokenizer
from preprocessor.processor_parts import save_without_missing_parts, without_missing_parts

QWEN3_5_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<think>", "</think>"]


def build_qwen3_5(out: Path) -> None:
    """Qwen3.5: gated delta-net linear attention and full attention layers in turn, M-RoPE, a Qwen3-VL style
    vision tower (patches merged 2x2); vocab_size padded above the tokenizer, as Qwen3.5's 248320 rows are."""
    from transformers import (
        Qwen2VLImageProcessorPil,
        Qwen3_5Config,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5TextConfig,
        Qwen3_5VisionConfig,
        Qwen3VLProcessor,
    )

    tok = build_tokenizer(QWEN3_5_SPECIALS, templates.QWEN3_5)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN3_5_SPECIALS}
    patch, merge = 8, 2
    text = Qwen3_5TextConfig(
        **dict(text_config_kwargs(tok), vocab_size=padded_vocab(tok), num_hidden_layers=4),
        head_dim=16,
        layer_types=["linear_attention", "full_attention"] * 2,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        # 16-dim heads rotate half their dims: 4 frequencies split 2/1/1 over time, height and width
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                             mrope_section=[2, 1, 1], mrope_interleaved=True),
    )
    vision = Qwen3_5VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=patch,
                                 spatial_merge_size=merge, temporal_patch_size=2, out_hidden_size=TEXT["hidden_size"],
                                 num_position_embeddings=16)
    config = Qwen3_5Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    model = Qwen3_5ForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    # Images resized to multiples of 16 px (patch 8, merged 2x2) between 2x2 and 4x4 merged tokens' worth
    unit = patch * merge
    image_processor = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=merge, temporal_patch_size=2,
                                               size={"shortest_edge": 4 * unit * unit,
                                                     "longest_edge": 16 * unit * unit})
    # No video processor: transformers has only a torchvision one, and Splice serves no video
    processor = without_missing_parts(Qwen3VLProcessor)(image_processor=image_processor, tokenizer=tok,
                                                        video_processor=None, chat_template=templates.QWEN3_5)
    assert processor.image_token_id == config.image_token_id
    model.save_pretrained(out)
    save_without_missing_parts(processor, out)
