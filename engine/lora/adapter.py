"""One LoRA adapter in PEFT's format, read and checked against the model it is to adapt.

A PEFT LoRA folder holds `adapter_config.json` (read with peft's own LoraConfig: r, lora_alpha, use_rslora,
target_modules, rank_pattern, alpha_pattern) and `adapter_model.safetensors`, whose keys are
`base_model.model.<module path>.lora_A.weight` [r, in] and `...lora_B.weight` [out, r], the module paths being the
base model's own (`model.layers.0.self_attn.q_proj`). Each adapted module's output gains `x @ A^T @ B^T * scale`,
scale = alpha / r (alpha / sqrt(r) with use_rslora), per module where the patterns say so, as PEFT's LoraLayer.

Everything is checked at load, and a refusal is one line naming the adapter and what is wrong: a module the model
does not have (or none that LoRA can adapt here: an embedding, the vocabulary projection), a rank over
--max-lora-rank, weights made for a base of another size, a corrupt or missing file, and what PEFT can express but
this engine does not apply (DoRA, LoRA biases, modules_to_save).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from splice.errors import InvalidArgument

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."  # what PEFT puts before the base model's module paths in the weights file


@dataclass(frozen=True)
class Target:
    """A linear layer of the model an adapter may adapt."""

    in_features: int
    out_features: int
    vision: bool  # in the vision tower or the connector (outside the language model)


@dataclass(frozen=True)
class LoraWeights:
    a: torch.Tensor  # [r, in] (PEFT's lora_A.weight)
    b: torch.Tensor  # [out, r] (PEFT's lora_B.weight)
    scale: float  # alpha / r, or alpha / sqrt(r) with use_rslora

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(eq=False)  # identity: two loads of one name are two adapters (a running request keeps the one it got)
class LoraAdapter:
    name: str  # what requests call it by (`model: NAME`)
    path: str  # the folder it was read from
    weights: dict[str, LoraWeights]  # module path -> its A, B and scale
    digest: str  # SHA-256 of its files: keys the prefix and encoder caches, so no entry is shared across adapters
    rank: int = field(init=False)  # the largest of its modules' ranks
    vision: bool = False  # it adapts a vision-tower or connector layer (the encoder cache keys then carry it)

    def __post_init__(self) -> None:
        self.rank = max(w.rank for w in self.weights.values())


def refuse(name: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"LoRA adapter {name!r}: {why}")


def read_config(name: str, folder: Path):
    """adapter_config.json through peft's LoraConfig (peft's own parsing and defaults)."""
    from peft import LoraConfig, PeftType

    path = folder / CONFIG
    if not path.is_file():
        raise refuse(name, f"{folder} has no {CONFIG} (a PEFT LoRA adapter folder holds {CONFIG} and {WEIGHTS})")
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        if raw.get("peft_type", "LORA") != PeftType.LORA:
            raise refuse(name, f"{CONFIG}: peft_type is {raw.get('peft_type')!r}; only LORA adapters are served")
        config = LoraConfig.from_pretrained(str(folder))
    except InvalidArgument:
        raise
    except Exception as exc:
        raise refuse(name, f"{CONFIG} is not a LoRA config peft can read: {exc}") from None
    unsupported = [what for what, used in (("DoRA (use_dora)", config.use_dora),
                                            ("LoRA biases (lora_bias)", getattr(config, "lora_bias", False)),
                                            ("modules_to_save", config.modules_to_save),
                                            (f"bias={config.bias!r}", config.bias != "none")) if used]
    if unsupported:
        raise refuse(name, f"{CONFIG} asks for {', '.join(unsupported)}, which this server does not apply")
    return config


def read_tensors(name: str, folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The weights file's tensors and the digest of the adapter's files."""
    from safetensors.torch import load

    path = folder / WEIGHTS
    if not path.is_file():
        raise refuse(name, f"{folder} has no {WEIGHTS} (only the safetensors format is served)")
    data = path.read_bytes()
    try:
        tensors = load(data)
    except Exception as exc:
        raise refuse(name, f"{WEIGHTS} is not a readable safetensors file: {exc}") from None
    digest = hashlib.sha256(data + (folder / CONFIG).read_bytes()).hexdigest()
    return tensors, digest


def module_pairs(name: str, tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Module path -> (lora_A, lora_B) from the weights file's keys."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        module, dot, kind = key.removeprefix(PREFIX).rpartition(".lora_")
        if not dot or kind not in ("A.weight", "B.weight"):
            raise refuse(name, f"{WEIGHTS} holds {key!r}, not a LoRA lora_A / lora_B weight of a linear layer")
        parts.setdefault(module, {})[kind[0]] = t
    pairs = {}
    for module, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise refuse(name, f"{WEIGHTS}: module {module!r} has lora_{''.join(ab)} without its other half")
        pairs[module] = (ab["A"], ab["B"])
    if not pairs:
        raise refuse(name, f"{WEIGHTS} holds no LoRA weights")
    return pairs


def load_adapter(name: str, path: str, targets: dict[str, Target], max_rank: int, hidden_size: int,
                 device: torch.device, dtype: torch.dtype) -> LoraAdapter:
    """Reads the adapter at `path` and checks it against the model's `targets` (module path -> Target) ->
    the adapter, its tensors on `device` in `dtype`. InvalidArgument (one line, naming the adapter) otherwise."""
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise refuse(name, f"{path} is not a folder")
    config = read_config(name, folder)
    tensors, digest = read_tensors(name, folder)
    pairs = module_pairs(name, tensors)
    if config.target_modules and not any(check_target_module_exists(config, m) for m in targets):
        wanted = config.target_modules
        raise refuse(name, f"target_modules {wanted if isinstance(wanted, str) else sorted(wanted)!r} match no "
                           "linear layer of this model")
    weights = {}
    for module, (a, b) in sorted(pairs.items()):
        target = targets.get(module)
        if target is None:
            raise refuse(name, f"adapts {module!r}, which this model does not have as a linear layer LoRA can adapt")
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise refuse(name, f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} are not a LoRA pair")
        rank = a.shape[0]
        if rank > max_rank:
            raise refuse(name, f"{module} has rank {rank}, over --max-lora-rank {max_rank}")
        if a.shape[1] != target.in_features or b.shape[0] != target.out_features:
            raise refuse(name, f"{module} maps {a.shape[1]} -> {b.shape[0]} features, this model's "
                               f"{target.in_features} -> {target.out_features}: it was made for another base model "
                               f"(this one's hidden size is {hidden_size})")
        if not (a.is_floating_point() and b.is_floating_point()) or not (a.isfinite().all() and b.isfinite().all()):
            raise refuse(name, f"{module}: its weights are not all finite floating-point numbers")
        alpha = config.alpha_pattern.get(get_pattern_key(config.alpha_pattern.keys(), module), config.lora_alpha)
        scale = alpha / math.sqrt(rank) if config.use_rslora else alpha / rank
        weights[module] = LoraWeights(a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype), scale)
    adapter = LoraAdapter(name, str(folder), weights, digest)
    adapter.vision = any(targets[m].vision for m in weights)
    return adapter
