"""tiny-gemma4 (engine/models/gemma4.py)."""

from __future__ import annotations

from pathlib import Path

from app.tiny import templates
from app.tiny.families.common import text_config_kwargs
from app.tiny.tokenizer import build_tokenizer
from preprocessor.processor_parts import save_without_missing_parts, without_missing_parts

# Gemma 4's named specials (its processor reads them off the tokenizer) and the others its template and processor use.
GEMMA4_NAMED = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
GEMMA4_SPECIALS = ["<|turn>", "<turn|>", "<|video|>"]


def build_gemma4(out: Path) -> None:
    """E2B-style: per-layer inputs, sliding and full layers (window 8, so tests pass it), the last layers reusing
    earlier layers' keys/values, final logit softcapping, and images of a variable number of soft tokens."""
    from transformers import (
        Gemma4AudioFeatureExtractor,
        Gemma4Config,
        Gemma4ForConditionalGeneration,
        Gemma4ImageProcessorPil,
        Gemma4Processor,
        Gemma4TextConfig,
        Gemma4VisionConfig,
    )

    tok = build_tokenizer(GEMMA4_SPECIALS, templates.GEMMA4, named=GEMMA4_NAMED)
    layers = 5
    text_config = Gemma4TextConfig(
        **{k: v for k, v in text_config_kwargs(tok).items() if k not in ("num_hidden_layers", "tie_word_embeddings")},
        num_hidden_layers=layers,
        head_dim=16,
        global_head_dim=32,  # full-attention layers have their own head size
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=8,
        num_kv_shared_layers=2,  # layers 3-4 reuse the keys/values of layers 1 (sliding) and 2 (full)
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=len(tok),
        final_logit_softcapping=30.0,
        tie_word_embeddings=True,
    )
    patch, pooling = 4, 3
    vision_config = Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=patch,
                                       pooling_kernel_size=pooling, position_embedding_size=64)
    token = tok.convert_tokens_to_ids
    config = Gemma4Config(
        text_config=text_config,
        vision_config=vision_config,
        audio_config=None,
        image_token_id=token("<|image|>"),
        boi_token_id=token("<|image>"),
        eoi_token_id=token("<image|>"),
        video_token_id=token("<|video|>"),
        audio_token_id=token("<|audio|>"),
        boa_token_id=token("<|audio>"),
        eoa_token_index=token("<audio|>"),
        tie_word_embeddings=True,
    )
    model = Gemma4ForConditionalGeneration(config)
    model.generation_config.eos_token_id = [tok.eos_token_id, token("<turn|>")]
    # 70 soft tokens at most (the smallest budget Gemma 4 allows), each pooling 3x3 patches of 4 px: a picture
    # is resized to keep its aspect ratio within 630 patches, so its soft-token count varies with its shape.
    image_processor = Gemma4ImageProcessorPil(patch_size=patch, max_soft_tokens=70, pooling_kernel_size=pooling)
    # No video processor: Gemma 4's needs torchvision (the preprocessor builds the processor without it too).
    processor = without_missing_parts(Gemma4Processor)(
        feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=image_processor, tokenizer=tok,
        video_processor=None, chat_template=templates.GEMMA4, image_seq_length=70)
    assert len(processor.tokenizer) == text_config.vocab_size, "processor added tokens"
    model.save_pretrained(out)
    save_without_missing_parts(processor, out)
