"""Writes the tiny checkpoints: deterministic from (BUILDER_VERSION, seed), cached on disk.

Each is a real HF architecture with random weights and the real model's vocabulary situation: most have
`vocab_size == len(tokenizer)`, no headroom, so a sentinel registered on top of the tokenizer overflows the
embedding table, exactly the SmolVLM-256M situation Splice exists for; those marked `headroom` (Gemma 3) pad
the table past the tokenizer, so a sentinel lands inside it.
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
from app.tiny.corpus import CORPUS
from app.tiny.tokenizer import EOS, PAD, build_tokenizer

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
    text = dict(_text_config_kwargs(tok), vocab_size=_with_headroom(len(tok)), head_dim=head_dim,
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


def _with_headroom(n: int) -> int:
    """The next multiple of 64 above n: gemma-3-4b-it has 262,145 tokens and 262,208 embedding rows."""
    return (n // 64 + 1) * 64
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

    from preprocessor.processor_parts import save_without_missing_parts, without_missing_parts

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
    family: str  # "text" | "llava" | "idefics3" | "gemma3"
    family: str  # "text" | "llava" | "idefics3" | "gemma4"
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
            training = " and training it (about a minute on CPU)" if TINY_MODELS[name].trained else ""
            progress(f"building {name} (seed {seed}){training} in {out}")
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
