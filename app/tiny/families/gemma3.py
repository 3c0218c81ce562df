"""tiny-gemma3: a SigLIP tower and a Gemma 3 decoder with sliding layers, headroom in its table
(engine/models/gemma3.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from app.tiny import templates
from app.tiny.families.common import TEXT, VISION, padded_vocab, text_config_kwargs
from app.tiny.tokenizer import build_tokenizer

# Gemma 3: a 4x4-patch image average-pooled to 2x2 soft tokens; sliding layers see the last 8 positions.
GEMMA3_TOKENS_PER_IMAGE = 4
GEMMA3_SLIDING_WINDOW = 8


def build_gemma3(out: Path) -> None:
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    named = dict(boi_token="<start_of_image>", eoi_token="<end_of_image>", image_token="<image_soft_token>")
    tok = build_tokenizer(["<start_of_turn>", "<end_of_turn>", *named.values()], templates.GEMMA3, named)
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in named.items()}
    head_dim = TEXT["hidden_size"] // TEXT["num_attention_heads"]
    text = dict(text_config_kwargs(tok), vocab_size=padded_vocab(tok), head_dim=head_dim,
                query_pre_attn_scalar=head_dim, tie_word_embeddings=True,
                # Sliding layers then a global one, like Gemma 3's 5:1 pattern; the window is shorter than the
                # test prompts (so it matters) and longer than one image's soft tokens.
                sliding_window=GEMMA3_SLIDING_WINDOW, layer_types=["sliding_attention", "full_attention"])
    config = Gemma3Config(
        vision_config=SiglipVisionConfig(**VISION, vision_use_head=False),  # Gemma 3 reads the patch states
        text_config=Gemma3TextConfig(**text),
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
        boi_token_index=ids["boi_token"],
        eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = Gemma3ForConditionalGeneration(config)
    # HF initializes the projection to zeros (every image would be blank soft tokens): random instead, so that
    # the soft tokens have the scale of the scaled text rows (initializer_range * sqrt(hidden)).
    scale = config.text_config.initializer_range * (TEXT["hidden_size"] / VISION["hidden_size"]) ** 0.5
    torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=scale)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_turn>")]
    side = VISION["image_size"]
    image_processor = Gemma3ImageProcessorPil(size={"height": side, "width": side}, do_pan_and_scan=False)
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tok,
                                image_seq_length=GEMMA3_TOKENS_PER_IMAGE, chat_template=templates.GEMMA3)
    assert len(processor.tokenizer) < config.text_config.vocab_size, "Gemma 3's table has headroom"
    model.save_pretrained(out)
    processor.save_pretrained(out)
