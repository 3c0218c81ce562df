"""Writes the tiny checkpoints: deterministic from (BUILDER_VERSION, seed), cached on disk.

Each is a real HF architecture with random weights and the real model's vocabulary situation: mostly
`vocab_size == len(tokenizer)`, no headroom, so a sentinel registered on top of the tokenizer overflows the
embedding table, exactly the SmolVLM-256M situation Splice exists for; where the real table is padded
(`vocab_headroom`, e.g. OneVision) the sentinel lands inside it and must still never reach the engine.
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
from preprocessor.images_only import images_only

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
    # No video processor: it needs torchvision (preprocessor/images_only.py)
    processor = images_only(LlavaOnevisionProcessor)(
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
    processor.save_pretrained(out)


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
    processor = images_only(SmolVLMProcessor)(image_processor=image_processor, tokenizer=tok, video_processor=None,
                                              image_seq_len=image_seq_len, chat_template=templates.SMOLVLM)
    assert len(processor.tokenizer) == config.text_config.vocab_size, "processor added tokens"
    model.save_pretrained(out)
    processor.save_pretrained(out)


@dataclass(frozen=True)
class TinyModel:
    name: str
    family: str  # "text" | "llava" | "idefics3" | "llava_onevision" | "smolvlm"
    build: Callable[[Path], None]
    # The real model's table has rows past len(tokenizer) (OneVision, Qwen2-VL): a sentinel then lands inside it.
    vocab_headroom: bool = False


TINY_MODELS: dict[str, TinyModel] = {
    m.name: m
    for m in (
        TinyModel("tiny-text", "text", _build_text),
        TinyModel("tiny-llava", "llava", _build_llava),
        TinyModel("tiny-idefics3", "idefics3", _build_idefics3),
        TinyModel("tiny-llava-onevision", "llava_onevision", _build_llava_onevision, vocab_headroom=True),
        TinyModel("tiny-smolvlm", "smolvlm", _build_smolvlm),
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
