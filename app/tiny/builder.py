"""The tiny checkpoints' registry: deterministic from (BUILDER_VERSION, seed), cached on disk; each family's
builder lives in app/tiny/families/.

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
from app.tiny.families import (
    gemma3,
    gemma4,
    idefics3,
    lfm2_vl,
    llava,
    llava_onevision,
    nemotron_h,
    qwen2_vl,
    qwen3_5,
    text,
)
from app.tiny.names import DEFAULT_MODEL, TINY_NAMES  # noqa: F401  (DEFAULT_MODEL: re-exported)
from app.tiny.tokenizer import EOS, PAD

# Bump whenever anything that ends up in a checkpoint changes: the cache folder name carries it, so a
# new version is built beside the old one instead of reusing stale files.
BUILDER_VERSION = 2  # 2: written by transformers 5
DEFAULT_SEED = 0
MARKER = "splice_tiny.json"


def model_dir(name: str, seed: int = DEFAULT_SEED) -> Path:
    spec = TINY_MODELS.get(name)
    revised = f"-r{spec.revision}" if spec is not None and spec.revision else ""
    return cache_root() / f"{name}{revised}-v{BUILDER_VERSION}-s{seed}"


@dataclass(frozen=True)
class TinyModel:
    name: str
    family: str  # what its marker records: the checkpoint's model_type, "text" for the plain text models
    build: Callable[[Path], None]
    # vocab_size > len(tokenizer), as in the real model: a sentinel lands inside the table (and must still never
    # reach the engine). False: vocab_size == len(tokenizer), a sentinel overflows it.
    headroom: bool = False
    # Trained (app/tiny/train.py) rather than random: its answers mean something on its task.
    trained: bool = False
    # Bumped when this model's own files change (its template, say): its folder name carries it, so only it is
    # rebuilt, not every tiny model as a BUILDER_VERSION bump would. 1: tiny-text's template renders tools.
    revision: int = 0


TINY_MODELS: dict[str, TinyModel] = {
    m.name: m
    for m in (
        TinyModel("tiny-text", "text", text.build_text, revision=1),
        TinyModel("tiny-text-bos", "text", text.build_text_bos),  # its tokenizer adds a BOS (Llama 3, Gemma)
        TinyModel("tiny-llava", "llava", llava.build_llava),
        TinyModel("tiny-idefics3", "idefics3", idefics3.build_idefics3),
        TinyModel("tiny-idefics3-colors", "idefics3", idefics3.build_idefics3_colors, trained=True),
        TinyModel("tiny-gemma3", "gemma3", gemma3.build_gemma3, headroom=True),
        TinyModel("tiny-gemma4", "gemma4", gemma4.build_gemma4),
        TinyModel("tiny-qwen2-vl", "qwen2_vl", qwen2_vl.build_qwen2_vl, headroom=True),
        TinyModel("tiny-qwen2.5-vl", "qwen2_5_vl", qwen2_vl.build_qwen2_5_vl, headroom=True),
        TinyModel("tiny-qwen3.5", "qwen3_5", qwen3_5.build_qwen3_5, headroom=True),
        TinyModel("tiny-lfm2-vl", "lfm2_vl", lfm2_vl.build_lfm2_vl, headroom=True),
        TinyModel("tiny-llava-onevision", "llava_onevision", llava_onevision.build_llava_onevision, headroom=True),
        TinyModel("tiny-smolvlm", "smolvlm", idefics3.build_smolvlm),
        TinyModel("tiny-nemotron-omni", "nemotron_h_omni", nemotron_h.build_nemotron_omni),
    )
}
assert sorted(TINY_MODELS) == sorted(TINY_NAMES), "each tiny model is listed by its family in splice/families.py"


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

