"""tiny-qwen2-vl and tiny-qwen2.5-vl: one builder, the two differing in their vision tower
(engine/models/qwen2_vl.py)."""

from __future__ import annotations

from pathlib import Path

from app.tiny import templates
from app.tiny.families.common import TEXT, padded_vocab, text_config_kwargs
from app.tiny.tokenizer import build_tokenizer
from preprocessor.processor_parts import save_without_missing_parts, without_missing_parts

QWEN2_VL_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def build_qwen2_vl(out: Path, v2_5: bool = False) -> None:
    import transformers
    from transformers import Qwen2VLImageProcessorPil

    prefix = "Qwen2_5_VL" if v2_5 else "Qwen2VL"
    tok = build_tokenizer(QWEN2_VL_SPECIALS, templates.QWEN2_VL)
    patch, merge = 8, 2
    # head_dim 16 -> 8 rotary frequencies split over (temporal, height, width) like the real [16, 24, 24]
    text = getattr(transformers, f"{prefix}TextConfig")(
        **dict(text_config_kwargs(tok), vocab_size=padded_vocab(tok)),
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
    )
    common = dict(depth=2, num_heads=2, in_channels=3, patch_size=patch, spatial_merge_size=merge,
                  temporal_patch_size=2)
    if v2_5:  # windowed attention in every block but the last (2 x 2 merged patches per window)
        vision = transformers.Qwen2_5_VLVisionConfig(**common, hidden_size=32, intermediate_size=64,
                                                     out_hidden_size=TEXT["hidden_size"], window_size=2 * merge * patch,
                                                     fullatt_block_indexes=[1], tokens_per_second=2)
    else:
        vision = transformers.Qwen2VLVisionConfig(**common, embed_dim=32, mlp_ratio=2, hidden_size=TEXT["hidden_size"])
    ids = {name: tok.convert_tokens_to_ids(f"<|{token}|>") for name, token in
           (("image_token_id", "image_pad"), ("video_token_id", "video_pad"),
            ("vision_start_token_id", "vision_start"), ("vision_end_token_id", "vision_end"))}
    config = getattr(transformers, f"{prefix}Config")(text_config=text, vision_config=vision, **ids,
                                                      tie_word_embeddings=False)
    model = getattr(transformers, f"{prefix}ForConditionalGeneration")(config)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")]
    # 16 px per merged token; from 2x2 up to 4x4 merged tokens per image (the real one: 28 px, 4 to 16384)
    side = patch * merge
    image_processor = Qwen2VLImageProcessorPil(patch_size=patch, temporal_patch_size=2, merge_size=merge,
                                               min_pixels=(2 * side) ** 2, max_pixels=(4 * side) ** 2)
    processor_cls = without_missing_parts(getattr(transformers, f"{prefix}Processor"))
    processor = processor_cls(image_processor=image_processor, tokenizer=tok, video_processor=None,
                              chat_template=templates.QWEN2_VL)
    assert len(processor.tokenizer) < config.text_config.vocab_size, "no headroom"
    model.save_pretrained(out)
    save_without_missing_parts(processor, out)


def build_qwen2_5_vl(out: Path) -> None:
    build_qwen2_vl(out, v2_5=True)
