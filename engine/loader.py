"""Loads an HF checkpoint for serving: device, dtype, the text backbone's parts, and its ModelInfo."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.vision import VisionFamily, vision_family
from splice.errors import FailedPrecondition
from splice.model_info import IMAGE, PROMPT_EMBEDS, TEXT, ModelInfo
from splice.tensors import DTYPES

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: torch.nn.Module  # the whole HF model (vision parts included)
    backbone: torch.nn.Module  # the decoder stack: takes inputs_embeds, returns hidden states
    lm_head: torch.nn.Module  # hidden -> vocabulary logits
    embed: torch.nn.Embedding  # the input embedding table (its rows are ModelInfo.vocab_rows)
    vision: VisionFamily | None
    info: ModelInfo
    device: torch.device
    dtype: torch.dtype


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise FailedPrecondition(f"--device {name}: CUDA is not available on this machine")
    return torch.device(name)


def pick_dtype(name: str, config, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cpu":  # half precision on CPU is slow and not what tests compare against
        return torch.float32
    saved = getattr(config, "dtype", None)  # transformers 5 reads a saved torch_dtype into dtype
    if isinstance(saved, str):
        saved = DTYPES.get(saved)
    return saved if saved in (torch.float16, torch.bfloat16, torch.float32) else torch.float32


def _eos_ids(path: str, text_config) -> tuple[int, ...]:
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    if eos is None:
        eos = getattr(text_config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def load(cfg: EngineConfig) -> LoadedModel:
    import transformers

    path = cfg.model
    if not (Path(path) / "config.json").exists():
        raise FailedPrecondition(f"{path}: no config.json (resolve the model with app.models.resolve_model)")
    config = transformers.AutoConfig.from_pretrained(path)
    arch = (config.architectures or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        raise FailedPrecondition(f"{path}: architecture {arch!r} is not a transformers class")
    vision = vision_family(config)
    device = pick_device(cfg.device)
    dtype = pick_dtype(cfg.dtype, config, device)
    log.info("loading %s (%s) on %s as %s", path, arch, device, dtype)
    # sdpa: the runner passes its own additive 4D masks, which sdpa and eager both take.
    model = cls.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).eval()

    backbone = model.get_decoder()  # transformers 5 answers with the text stack for VLMs too
    lm_head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    if backbone is None or lm_head is None:
        raise FailedPrecondition(f"{arch}: no decoder / output embeddings to serve")
    text_config = config.get_text_config()
    max_position = getattr(text_config, "max_position_embeddings", None)
    max_len = cfg.max_model_len or max_position
    if max_len is None:
        raise FailedPrecondition(f"{path}: config has no max_position_embeddings; pass --max-model-len")
    if max_position is not None and max_len > max_position:
        raise FailedPrecondition(
            f"--max-model-len {max_len} exceeds the model's max_position_embeddings {max_position}")
    image_token_id = None
    kinds: tuple[str, ...] = (TEXT, PROMPT_EMBEDS)
    if vision is not None:
        image_token_id = getattr(config, "image_token_id", None)
        if image_token_id is None:
            image_token_id = getattr(config, "image_token_index", None)
        kinds = (TEXT, PROMPT_EMBEDS, IMAGE)
    info = ModelInfo(
        model=cfg.served_name,
        architecture=arch,
        vocab_rows=int(embed.weight.shape[0]),
        hidden_size=int(embed.weight.shape[1]),
        dtype=str(dtype).removeprefix("torch."),
        max_model_len=int(max_len),
        image_token_id=image_token_id,
        input_kinds=kinds,
        eos_token_ids=_eos_ids(path, text_config),
    )
    return LoadedModel(model, backbone, lm_head, embed, vision, info, device, dtype)
