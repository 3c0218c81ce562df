"""Loads an HF checkpoint for serving: device, dtype, its model family (engine/models/), and its ModelInfo."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.encoder_cache import EncoderCache
from engine.kernels import decode_attention as decode_kernel
from engine.kernels import small_rows
from engine.lora import Target, attach
from engine.models import ModelFamily, family_for
from engine.simulate import simulated
from splice.errors import FailedPrecondition
from splice.model_info import IMAGE, PROMPT_EMBEDS, TEXT, ModelInfo
from splice.tensors import DTYPES

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    family: ModelFamily  # the HF model and everything the engine needs to know about its architecture
    info: ModelInfo
    # --enable-lora: the linear layers an adapter may adapt (module path -> Target; engine/lora/sites.py); else None
    lora_targets: dict[str, Target] | None = None

    @property
    def model(self) -> torch.nn.Module:  # the whole HF model (vision parts included)
        return self.family.model

    @property
    def embed(self) -> torch.nn.Module:  # the input embedding table (its rows are ModelInfo.vocab_rows)
        return self.family.embed

    @property
    def device(self) -> torch.device:
        return self.family.device

    @property
    def dtype(self) -> torch.dtype:
        return self.family.dtype


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
    from transformers import DistributedConfig

    path = cfg.model
    if not (Path(path) / "config.json").exists():
        raise FailedPrecondition(f"{path}: no config.json (resolve the model with app.models.resolve_model)")
    config = transformers.AutoConfig.from_pretrained(path)
    family_cls = family_for(config)
    arch = (config.architectures or [family_cls.name])[0]
    if cfg.simulate_forward_ms is not None:  # a benchmarking aid: the model's calls become waits (engine/simulate.py)
        family_cls = simulated(family_cls, cfg.simulate_forward_ms)
        log.warning("--simulate-forward-ms %g: the forward and vision tower are SIMULATED (a wait of %g ms per step, "
                    "deterministic tokens); for benchmarking only", cfg.simulate_forward_ms, cfg.simulate_forward_ms)
    device = pick_device(cfg.device)
    if cfg.torch_threads is not None:
        torch.set_num_threads(cfg.torch_threads)
    pretrained = {}
    if cfg.tensor_parallel_size > 1:  # this process is one rank (engine/tensor_parallel.py)
        pretrained["distributed_config"] = DistributedConfig(tp_size=cfg.tensor_parallel_size, tp_plan="auto")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    dtype = pick_dtype(cfg.dtype, config, device)
    log.info("loading %s (%s, family %s) on %s as %s, %d torch thread(s)", path, arch, family_cls.name, device, dtype,
             torch.get_num_threads())
    model = family_cls.load_model(path, config, dtype, **pretrained).to(device).eval()
    if device.type == "cpu" and dtype == torch.bfloat16:
        decode_kernel.prepare()  # compiled here once per host, not in the first request
        small_rows.prepare()
    family = family_cls(model, device, dtype)
    impl = family.select_impl(cfg.model_impl, tensor_parallel=cfg.tensor_parallel_size > 1)
    log.info("text stack: %s (--model-impl %s)", impl, cfg.model_impl)
    targets = attach(family) if cfg.enable_lora else None
    if family.accepts_images and cfg.encoder_cache_mb:
        family.encoder_cache = EncoderCache(cfg.encoder_cache_mb << 20)
    embed = family.embed
    text_config = config.get_text_config()
    max_position = getattr(text_config, "max_position_embeddings", None)
    max_len = cfg.max_model_len or max_position
    if max_len is None:
        raise FailedPrecondition(f"{path}: config has no max_position_embeddings; pass --max-model-len")
    if max_position is not None and max_len > max_position:
        raise FailedPrecondition(
            f"--max-model-len {max_len} exceeds the model's max_position_embeddings {max_position}")
    kinds = (TEXT, PROMPT_EMBEDS, IMAGE) if family.accepts_images else (TEXT, PROMPT_EMBEDS)
    info = ModelInfo(
        model=cfg.served_name,
        architecture=arch,
        vocab_rows=int(embed.weight.shape[0]),
        hidden_size=int(embed.weight.shape[1]),
        dtype=str(dtype).removeprefix("torch."),
        max_model_len=int(max_len),
        image_token_id=family.image_token_id,
        input_kinds=kinds,
        eos_token_ids=_eos_ids(path, text_config),
    )
    return LoadedModel(family, info, targets)
