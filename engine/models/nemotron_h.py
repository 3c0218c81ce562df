"""Nemotron-H (NemotronHForCausalLM) and Nemotron 3 Nano Omni (NemotronH_Omni_Reasoning_V3): a hybrid decoder
of Mamba2, attention and MoE layers; the Omni model puts a RADIO tower and a pixel-shuffle projector in front.

What differs from an attention-only family:
- the cache is built from the config (recurrent layers) and its rows join / leave per layer kind
  (engine/models/hybrid_cache.py, as Qwen3.5's and LFM2's);
- Mamba layers take the 2-D padding mask of the new positions (the model looks it up under
  "linear_attention"; "full_attention" gets the 4-D causal mask): without it, left padding leaks into
  the recurrent state;
- the Omni model has no ForConditionalGeneration head (get_output_embeddings() is None): the text stack and
  the head are its language model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.models.base import (
    ImageGeometry,
    ModelFamily,
    StepInputs,
    check_float,
    check_names,
    feature_rows,
    grid_pieces,
)
from engine.models.hybrid_cache import HybridCache, recurrent_mask
from splice.errors import InvalidArgument

INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.uint8, torch.int8)


@dataclass(frozen=True)
class NemotronOmniImages(ImageGeometry):
    """pixel_values [patches, channels * patch**2] (every image's patches, concatenated) + image_grid_hw
    [images, 2] patch grids -> one row per merge x merge patches (the pixel shuffle)."""

    patch_dim: int
    merge: int

    @classmethod
    def from_config(cls, config: Any) -> NemotronOmniImages:
        vc = config.vision_config
        return cls(vc.num_channels * vc.patch_size**2, round(1 / config.downsample_ratio))

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        names = ("pixel_values", "image_grid_hw")
        check_names(inputs, names, names)
        pv, grid = inputs["pixel_values"], inputs["image_grid_hw"]
        if pv.dim() != 2 or pv.shape[1] != self.patch_dim:
            raise InvalidArgument(f"pixel_values: shape {list(pv.shape)}, expected [patches, {self.patch_dim}]")
        check_float("pixel_values", pv)
        if grid.dim() != 2 or grid.shape[1] != 2 or grid.dtype not in INT_DTYPES:
            raise InvalidArgument(f"image_grid_hw: shape {list(grid.shape)} {grid.dtype}, expected [images, 2] "
                                  "integers")
        if (grid <= 0).any() or (grid % self.merge).any():
            raise InvalidArgument(f"image_grid_hw: {grid.tolist()}, every side must be a positive multiple of "
                                  f"{self.merge}")
        patches = int(grid.long().prod(-1).sum())
        if patches != pv.shape[0]:
            raise InvalidArgument(f"pixel_values: {pv.shape[0]} patches, but image_grid_hw describes {patches}")
        return patches // self.merge**2


class NemotronH(ModelFamily):
    name = "nemotron_h"
    packs_mixed_steps = False  # Mamba states beside attention

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.cache = HybridCache(self.text_config)
        if getattr(self.config, "vision_config", None) is not None:
            self.images = NemotronOmniImages.from_config(self.config)

    @classmethod
    def load_model(cls, path: str, config: Any, dtype: torch.dtype, **pretrained: Any) -> torch.nn.Module:
        """By model_type: released Omni checkpoints name a remote-code class in `architectures`."""
        import transformers

        model_cls = (transformers.NemotronH_Omni_Reasoning_V3 if config.model_type == "nemotron_h_omni"
                     else transformers.NemotronHForCausalLM)
        return model_cls.from_pretrained(path, dtype=dtype, attn_implementation="sdpa", **pretrained)

    @staticmethod
    def text_parts(model: torch.nn.Module) -> tuple[Any, Any, Any]:
        lm = getattr(model, "language_model", model)  # the Omni model's NemotronHForCausalLM, or the model itself
        return lm.model, lm.lm_head, model.get_input_embeddings()

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        grid = inputs["image_grid_hw"].to(device=self.device, dtype=torch.long)
        return feature_rows(self.model.get_image_features(pv, grid))  # [patches / merge**2, hidden]

    def image_pieces(self, inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return grid_pieces(inputs, "image_grid_hw")  # one per image

    def attention_mask(self, step: StepInputs) -> dict[str, torch.Tensor | None]:
        return {"full_attention": self.causal_mask(step.mask, step.token_ids.shape[1]),
                "linear_attention": recurrent_mask(step)}
