"""Built-in LoRA adapters, made with PEFT on the built-in models: `BASE-lora` (and `BASE-lora2`, `BASE-lora3`, ...:
other seeds) for each base below, written once into the model cache, in PEFT's format (adapter_config.json +
adapter_model.safetensors).

They are untrained: PEFT's `init_lora_weights=False` draws A and B at random (B non-zero, so answers change), from a
fixed seed. They exercise the serving of adapters (tests, benches, `splice up --lora-modules NAME=tiny-text-lora`);
their answers mean nothing, on the real model as on the tiny ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.cache import build_once, cache_root

LORA_VERSION = 1  # bump when what ends up in an adapter changes: its folder name carries it
MARKER = "splice_lora.json"
LM = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSpec:
    target_modules: tuple[str, ...] | str  # PEFT's: module name suffixes, or one regex over module paths
    r: int = 8
    alpha: int = 16
    b_scale: float = 1.0  # PEFT's random B times this (the real model's layers stay in range)


LORA_BASES: dict[str, LoraSpec] = {
    "tiny-text": LoraSpec(LM),
    # the language model, the CLIP tower (q/k/v/out_proj, fc1/fc2) and the connector (linear_1/2)
    "tiny-llava": LoraSpec((*LM, "out_proj", "fc1", "fc2", "linear_1", "linear_2")),
    # the hybrid's language model only: attention, short-convolution projections and the MLP
    "tiny-lfm2-vl": LoraSpec(r"model\.language_model\..*\.(q_proj|k_proj|v_proj|out_proj|in_proj|w1|w2|w3)", r=4,
                             alpha=8),
    "smollm2-135m-instruct": LoraSpec(LM, b_scale=0.05),
}
NAME = re.compile(r"(?P<base>.+)-lora(?P<n>[1-9][0-9]*)?")


def parse(name: str) -> tuple[str, int] | None:
    """(base, seed) of a built-in adapter's name; None for any other name."""
    m = NAME.fullmatch(name)
    if m is None or m["base"] not in LORA_BASES:
        return None
    return m["base"], int(m["n"] or 1) - 1


def builtin_names() -> list[str]:
    return [f"{base}-lora" for base in LORA_BASES]


def lora_dir(name: str) -> Path:
    base, seed = parse(name)
    return cache_root() / f"{base}-lora-v{LORA_VERSION}-s{seed}"


def ensure_lora(name: str, progress: Callable[[str], None] | None = None) -> Path:
    """The folder of built-in adapter `name`, made (once, across processes) when missing."""
    found = parse(name)
    if found is None:
        raise ValueError(f"{name!r} is not a built-in adapter; built in: {builtin_names()} (a number after -lora picks "
                         "another seed)")
    out = lora_dir(name)
    return build_once(out, MARKER, lambda tmp: _build(found[0], found[1], tmp),
                      (lambda: progress(f"making LoRA adapter {name} in {out}")) if progress else None)


def _build(base: str, seed: int, out: Path) -> None:
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    from app.real_model import REAL_MODELS, ensure_real
    from app.tiny import ensure

    spec = LORA_BASES[base]
    folder = ensure_real(base) if base in REAL_MODELS else ensure(base)
    config = transformers.AutoConfig.from_pretrained(folder)
    model = getattr(transformers, config.architectures[0]).from_pretrained(folder, dtype=torch.float32)
    state = torch.random.get_rng_state()
    torch.manual_seed(1000 + seed)
    try:
        lora = LoraConfig(r=spec.r, lora_alpha=spec.alpha, init_lora_weights=False,
                          target_modules=spec.target_modules if isinstance(spec.target_modules, str)
                          else list(spec.target_modules))
        peft_model = get_peft_model(model, lora)
    finally:
        torch.random.set_rng_state(state)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if ".lora_B." in name:
                p.mul_(spec.b_scale)
    peft_model.save_pretrained(out)
    meta = json.loads((out / "adapter_config.json").read_text())
    meta["base_model_name_or_path"] = base  # (the cache folder it was made from is this machine's)
    (out / "adapter_config.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    (out / MARKER).write_text(json.dumps({"base": base, "seed": seed, "version": LORA_VERSION}) + "\n")
