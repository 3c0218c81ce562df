"""Writes the tiny checkpoints: deterministic from (BUILDER_VERSION, seed), cached on disk.

Each is a real HF architecture with random weights and `vocab_size == len(tokenizer)`: no headroom,
so a sentinel registered on top of the tokenizer always overflows the embedding table, exactly the
SmolVLM-256M situation Splice exists for.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from app.tiny import templates
from app.tiny.tokenizer import EOS, PAD, build_tokenizer

# Bump whenever anything that ends up in a checkpoint changes: the cache folder name carries it, so a
# new version is built beside the old one instead of reusing stale files.
BUILDER_VERSION = 2  # 2: written by transformers 5
DEFAULT_SEED = 0
DEFAULT_MODEL = "tiny-idefics3"
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
IDEFICS3_SPECIALS = (
    ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
)


def cache_root() -> Path:
    """Where tiny models live: $SPLICE_CACHE, else ~/.cache/splice."""
    return Path(os.environ.get("SPLICE_CACHE", Path.home() / ".cache" / "splice")) / "models"


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


def _build_idefics3(out: Path) -> None:
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    tok = build_tokenizer(IDEFICS3_SPECIALS, templates.IDEFICS3)
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

    from preprocessor.pil_processors import NemotronH_Omni_Reasoning_V3ImageProcessorPil, NemotronOmniImageTextProcessor

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
    processor = NemotronOmniImageTextProcessor(image_processor=image_processor, tokenizer=tok,
                                               chat_template=templates.NEMOTRON_OMNI)
    assert len(processor.tokenizer) == text.vocab_size, "processor added tokens"
    model.save_pretrained(out)
    processor.save_pretrained(out)


@dataclass(frozen=True)
class TinyModel:
    name: str
    family: str  # "text" | "llava" | "idefics3" | "nemotron_h_omni"
    build: Callable[[Path], None]


TINY_MODELS: dict[str, TinyModel] = {
    m.name: m
    for m in (
        TinyModel("tiny-text", "text", _build_text),
        TinyModel("tiny-llava", "llava", _build_llava),
        TinyModel("tiny-idefics3", "idefics3", _build_idefics3),
        TinyModel("tiny-nemotron-omni", "nemotron_h_omni", _build_nemotron_omni),
    )
}


def ensure(name: str, seed: int = DEFAULT_SEED, progress: Callable[[str], None] | None = None) -> Path:
    """Folder of the tiny checkpoint `name`, building it (once, across processes) when missing."""
    if name not in TINY_MODELS:
        raise ValueError(f"unknown tiny model {name!r}; choose from {sorted(TINY_MODELS)}")
    out = model_dir(name, seed)
    if (out / MARKER).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same model
        if (out / MARKER).exists():
            return out
        if progress:
            progress(f"building {name} (seed {seed}) in {out}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            _build_seeded(TINY_MODELS[name], tmp, seed)
            if out.exists():
                shutil.rmtree(out)
            tmp.chmod(0o755)
            tmp.rename(out)  # atomic: readers see a complete folder or none
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


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
