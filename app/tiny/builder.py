"""Writes the tiny checkpoints: deterministic from (BUILDER_VERSION, seed), cached on disk.

Each is a real HF architecture with random weights and the real model's vocabulary situation: most have
`vocab_size == len(tokenizer)`, no headroom, so a sentinel registered on top of the tokenizer overflows the
embedding table, exactly the SmolVLM-256M situation Splice exists for; those marked `headroom` (Gemma 3,
Qwen2-VL, Qwen3.5, LFM2, LLaVA-OneVision) pad the table past the tokenizer as their real models do, so a
sentinel lands inside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from app.cache import build_once, cache_root
from app.tiny import templates
from app.tiny.corpus import CORPUS
from app.tiny.tokenizer import EOS, PAD, build_tokenizer
from preprocessor.processor_parts import save_without_missing_parts, without_missing_parts

# Bump whenever anything that ends up in a checkpoint changes: the cache folder name carries it, so a
# new version is built beside the old one instead of reusing stale files.
BUILDER_VERSION = 2  # 2: written by transformers 5
DEFAULT_SEED = 0
DEFAULT_MODEL = "tiny-idefics3-colors"
MARKER = "splice_tiny.json"

# Sizes shared by every tiny text backbone.
TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
# Vision towers: 32x32 pixels in 8x8 patches = 16 patches per image (or tile).
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              image_size=32, patch_size=8)
# Gemma 3: a 4x4-patch image average-pooled to 2x2 soft tokens; sliding layers see the last 8 positions.
GEMMA3_TOKENS_PER_IMAGE = 4
GEMMA3_SLIDING_WINDOW = 8
# Gemma 4's named specials (its processor reads them off the tokenizer) and the others its template and processor use.
GEMMA4_NAMED = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
GEMMA4_SPECIALS = ["<|turn>", "<turn|>", "<|video|>"]
QWEN2_VL_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IDEFICS3_SPECIALS = (
    ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
)


def model_dir(name: str, seed: int = DEFAULT_SEED) -> Path:
    return cache_root() / f"{name}-v{BUILDER_VERSION}-s{seed}"


def _text_config_kwargs(tok) -> dict:
    return dict(TEXT, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)


def _build_text(out: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer([], templates.CHATML)
    model = LlamaForCausalLM(LlamaConfig(**_text_config_kwargs(tok)))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _build_llava(out: Path) -> None:
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
        text_config=LlamaConfig(**_text_config_kwargs(tok)),
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


def _build_idefics3(out: Path, corpus: str = CORPUS) -> None:
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    tok = build_tokenizer(IDEFICS3_SPECIALS, templates.IDEFICS3, corpus=corpus)
    scale_factor = 2
    config = Idefics3Config(
        vision_config=Idefics3VisionConfig(**VISION),
        text_config=LlamaConfig(**_text_config_kwargs(tok)),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=scale_factor,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    model = Idefics3ForConditionalGeneration(config)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_utterance>")]
    side = VISION["image_size"]
    # Images up to 2x2 tiles of 32 px plus the global view, like SmolVLM's 512 px tiles.
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 2 * side}, max_image_size={"longest_edge": side})
    image_seq_len = (side // VISION["patch_size"]) ** 2 // scale_factor**2
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=image_seq_len,
                                  chat_template=templates.IDEFICS3)
    assert len(processor.tokenizer) == config.text_config.vocab_size, "processor added tokens"
    model.save_pretrained(out)
    processor.save_pretrained(out)


def _build_gemma3(out: Path) -> None:
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
    text = dict(_text_config_kwargs(tok), vocab_size=_padded_vocab(tok), head_dim=head_dim,
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


NEMOTRON_OMNI_SPECIALS = ["<image>", "<img>", "</img>", "<think>", "</think>"]


def _build_nemotron_omni(out: Path) -> None:
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


QWEN3_5_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<think>", "</think>"]


def _build_qwen3_5(out: Path) -> None:
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
        **dict(_text_config_kwargs(tok), vocab_size=_padded_vocab(tok), num_hidden_layers=4),
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


LFM2_VL_SPECIALS = (["<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]
                    + [f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5)])


def _build_lfm2_vl(out: Path) -> None:
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
        vocab_size=_padded_vocab(tok),
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


# llava-onevision-qwen2: 151646 tokens in a 152000-row table; the tiny keeps that headroom, rounded to 64.
ONEVISION_HEADROOM = 354


def _build_llava_onevision(out: Path) -> None:
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
        text_config=Qwen2Config(**dict(_text_config_kwargs(tok), vocab_size=vocab_size)),
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


def _padded_vocab(tok) -> int:
    """The next multiple of 64 above len(tok): rows no token uses, where a registered sentinel lands."""
    return (len(tok) // 64 + 1) * 64


def _build_qwen2_vl(out: Path, v2_5: bool = False) -> None:
    import transformers
    from transformers import Qwen2VLImageProcessorPil

    prefix = "Qwen2_5_VL" if v2_5 else "Qwen2VL"
    tok = build_tokenizer(QWEN2_VL_SPECIALS, templates.QWEN2_VL)
    patch, merge = 8, 2
    # head_dim 16 -> 8 rotary frequencies split over (temporal, height, width) like the real [16, 24, 24]
    text = getattr(transformers, f"{prefix}TextConfig")(
        **dict(_text_config_kwargs(tok), vocab_size=_padded_vocab(tok)),
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


def _build_gemma4(out: Path) -> None:
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
        **{k: v for k, v in _text_config_kwargs(tok).items() if k not in ("num_hidden_layers", "tie_word_embeddings")},
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
def _build_smolvlm(out: Path) -> None:
    from transformers import (
        LlamaConfig,
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessorPil,
        SmolVLMProcessor,
        SmolVLMVisionConfig,
    )

    tok = build_tokenizer(IDEFICS3_SPECIALS, templates.SMOLVLM)
    scale_factor = 2
    config = SmolVLMConfig(
        vision_config=SmolVLMVisionConfig(**VISION),
        text_config=LlamaConfig(**_text_config_kwargs(tok)),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=scale_factor,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    model = SmolVLMForConditionalGeneration(config)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_utterance>")]
    side = VISION["image_size"]
    image_processor = SmolVLMImageProcessorPil(size={"longest_edge": 2 * side}, max_image_size={"longest_edge": side},
                                               image_mean=[0.5] * 3, image_std=[0.5] * 3)
    image_seq_len = (side // VISION["patch_size"]) ** 2 // scale_factor**2
    processor = without_missing_parts(SmolVLMProcessor)(image_processor=image_processor, tokenizer=tok,
                                                        video_processor=None, image_seq_len=image_seq_len,
                                                        chat_template=templates.SMOLVLM)
    assert len(processor.tokenizer) == config.text_config.vocab_size, "processor added tokens"
    model.save_pretrained(out)
    save_without_missing_parts(processor, out)


def _build_idefics3_colors(out: Path) -> None:
    """tiny-idefics3, its tokenizer also learned from the colour task's text, then trained on that task (about a
    minute on CPU): the built-in model whose answers mean something."""
    from app.tiny import colors
    from app.tiny.train import train_colors

    _build_idefics3(out, corpus=CORPUS + colors.corpus())
    train_colors(out, seed=torch.initial_seed())


@dataclass(frozen=True)
class TinyModel:
    name: str
    family: str  # the engine family (engine/models/) that serves it
    build: Callable[[Path], None]
    # vocab_size > len(tokenizer), as in the real model: a sentinel lands inside the table (and must still never
    # reach the engine). False: vocab_size == len(tokenizer), a sentinel overflows it.
    headroom: bool = False
    # Trained (app/tiny/train.py) rather than random: its answers mean something on its task.
    trained: bool = False


TINY_MODELS: dict[str, TinyModel] = {
    m.name: m
    for m in (
        TinyModel("tiny-text", "text", _build_text),
        TinyModel("tiny-llava", "llava", _build_llava),
        TinyModel("tiny-idefics3", "idefics3", _build_idefics3),
        TinyModel("tiny-idefics3-colors", "idefics3", _build_idefics3_colors, trained=True),
        TinyModel("tiny-gemma3", "gemma3", _build_gemma3, headroom=True),
        TinyModel("tiny-gemma4", "gemma4", _build_gemma4),
        TinyModel("tiny-qwen2-vl", "qwen2_vl", _build_qwen2_vl, headroom=True),
        TinyModel("tiny-qwen2.5-vl", "qwen2_5_vl", lambda out: _build_qwen2_vl(out, v2_5=True), headroom=True),
        TinyModel("tiny-qwen3.5", "qwen3_5", _build_qwen3_5, headroom=True),
        TinyModel("tiny-lfm2-vl", "lfm2_vl", _build_lfm2_vl, headroom=True),
        TinyModel("tiny-llava-onevision", "llava_onevision", _build_llava_onevision, headroom=True),
        TinyModel("tiny-smolvlm", "smolvlm", _build_smolvlm),
        TinyModel("tiny-nemotron-omni", "nemotron_h_omni", _build_nemotron_omni),
    )
}


def ensure(name: str, seed: int = DEFAULT_SEED, progress: Callable[[str], None] | None = None) -> Path:
    """Folder of the tiny checkpoint `name`, building it (once, across processes) when missing."""
    if name not in TINY_MODELS:
        raise ValueError(f"unknown tiny model {name!r}; choose from {sorted(TINY_MODELS)}")
    out = model_dir(name, seed)

    def announce() -> None:
        if progress:
            training = " and training it (about a minute on CPU)" if TINY_MODELS[name].trained else ""
            progress(f"building {name} (seed {seed}){training} in {out}")

    return build_once(out, MARKER, lambda tmp: _build_seeded(TINY_MODELS[name], tmp, seed), announce)


def _build_seeded(spec: TinyModel, out: Path, seed: int) -> None:
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        spec.build(out)
    finally:
        torch.random.set_rng_state(state)
    meta = {"name": spec.name, "family": spec.family, "builder_version": BUILDER_VERSION, "seed": seed,
            "eos": EOS, "pad": PAD}
    (out / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
