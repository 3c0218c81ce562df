"""tiny-nemotron-omni (engine/models/nemotron_h.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from app.tiny import templates
from app.tiny.families.common import VISION
from app.tiny.tokenizer import build_tokenizer
from preprocessor.processor_parts import save_without_missing_parts, without_missing_parts

NEMOTRON_OMNI_SPECIALS = ["<image>", "<img>", "</img>", "<think>", "</think>"]


def build_nemotron_omni(out: Path) -> None:
    """Nemotron 3 Nano Omni: a Mamba2 + attention + MoE decoder (NemotronHForCausalLM) behind a RADIO tower and a
    pixel-shuffle projector; the real model has no vocabulary headroom, nor has this one. Layers as the real
    pattern begins (Mamba, MoE, attention, Mamba): a Mamba layer after attention is where left padding would
    reach the recurrent state (attention gives padded positions nonzero outputs)."""
    from transformers import (
        NemotronH_Omni_Reasoning_V3,
        NemotronH_Omni_Reasoning_V3_Config,
        NemotronHConfig,
        RadioConfig,
    )
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import NemotronH_Omni_Reasoning_V3Processor

    from preprocessor.pil_image_processors import NemotronH_Omni_Reasoning_V3ImageProcessorPil

    tok = build_tokenizer(NEMOTRON_OMNI_SPECIALS, templates.NEMOTRON_OMNI)
    text = NemotronHConfig(
        vocab_size=len(tok), hidden_size=64,
        layers_block_type=["linear_attention", "moe", "full_attention", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1, conv_kernel=4, chunk_size=32,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
        n_shared_experts=1, intermediate_size=128, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    patch = VISION["patch_size"]
    vision = RadioConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2.0,
                         patch_size=patch, image_size=VISION["image_size"], max_img_size=128, num_cls_tokens=2,
                         num_registers=2, video_temporal_patch_size=2)
    config = NemotronH_Omni_Reasoning_V3_Config(
        vision_config=vision, text_config=text, downsample_ratio=0.5, projector_hidden_size=64,
        vision_hidden_size=32, image_token_id=tok.convert_tokens_to_ids("<image>"), tie_word_embeddings=False,
    )
    model = NemotronH_Omni_Reasoning_V3(config)
    # The Omni class's init leaves every Mamba step size at softplus(1) (a memory of about one token): draw them as
    # NemotronHForCausalLM does (time_step_min..max), so the state carries over many tokens as in trained models.
    # With std-0.02 projections the state is ~1e-6 and the skip term D * x hides it: unit-scale input projections
    # and D = 0 make each Mamba layer's output come from its recurrent state, so a wrong state changes the tokens.
    for layer in model.language_model.model.layers:
        if layer.block_type == "linear_attention":
            model.language_model._init_weights(layer.mixer)
            torch.nn.init.normal_(layer.mixer.in_proj.weight, std=text.hidden_size**-0.5)
            torch.nn.init.zeros_(layer.mixer.D)
    model.generation_config.eos_token_id = tok.eos_token_id
    # Images become a patch grid of 4..64 patches of 8 px (1..16 image tokens after the 2x2 pixel shuffle).
    image_processor = NemotronH_Omni_Reasoning_V3ImageProcessorPil(patch_size=patch, downsample_ratio=0.5,
                                                                   min_num_patches=16, max_num_patches=64,
                                                                   max_model_len=2048)
    # No video processor nor audio feature extractor: transformers has them only with torchvision / audio libs.
    processor = without_missing_parts(NemotronH_Omni_Reasoning_V3Processor)(
        image_processor=image_processor, tokenizer=tok, video_processor=None, feature_extractor=None,
        chat_template=templates.NEMOTRON_OMNI)
    assert len(processor.tokenizer) == text.vocab_size, "processor added tokens"
    model.save_pretrained(out)
    save_without_missing_parts(processor, out)
