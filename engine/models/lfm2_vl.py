"""LFM2-VL (Lfm2VlForConditionalGeneration): short gated convolutions between attention layers
(engine/models/hybrid_cache.py), a SigLIP2 NaFlex tower on tiles plus a thumbnail, pixel-unshuffled by the
downsample factor. Each tile [patches padded to max, patch * patch * channels] with its valid patch count
and spatial shape [h, w] makes (h / factor) * (w / factor) rows."""

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
    first_dim_pieces,
)
from engine.models.hybrid_cache import HybridCache, recurrent_mask
from splice.errors import InvalidArgument


@dataclass(frozen=True)
class Lfm2VlImages(ImageGeometry):
    channels: int
    patch_size: int
    max_patches: int  # the tower's position grid: at most this many patches per tile
    factor: int

    @classmethod
    def from_config(cls, config: Any) -> Lfm2VlImages:
        vc = config.vision_config
        return cls(vc.num_channels, vc.patch_size, vc.num_patches, config.downsample_factor)

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        names = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
        check_names(inputs, names, names)
        pv, mask, shapes = (inputs[n] for n in names)
        width = self.channels * self.patch_size**2
        if pv.dim() != 3 or pv.shape[2] != width:
            raise InvalidArgument(f"pixel_values: shape {list(pv.shape)}, expected [tiles, patches, {width}]")
        check_float("pixel_values", pv)
        if tuple(mask.shape) != tuple(pv.shape[:2]):
            raise InvalidArgument(f"pixel_attention_mask: shape {list(mask.shape)}, expected {list(pv.shape[:2])}")
        if tuple(shapes.shape) != (pv.shape[0], 2) or shapes.dtype.is_floating_point:
            raise InvalidArgument(f"spatial_shapes: shape {list(shapes.shape)} {shapes.dtype}, expected "
                                  f"[{pv.shape[0]}, 2] integers")
        h, w = shapes[:, 0], shapes[:, 1]
        real = mask.long().sum(1)
        if bool((h <= 0).any() | (w <= 0).any() | (h % self.factor != 0).any() | (w % self.factor != 0).any()
                | (h * w > pv.shape[1]).any() | (h * w != real).any()):
            raise InvalidArgument(f"spatial_shapes: {shapes.tolist()} must be positive multiples of {self.factor} "
                                  f"whose product is each tile's count of real patches {real.tolist()}")
        return int(((h // self.factor) * (w // self.factor)).sum())


class Lfm2Vl(ModelFamily):
    name = "lfm2_vl"
    packs_mixed_steps = False  # convolution states beside attention

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.images = Lfm2VlImages.from_config(self.config)
        self.cache = HybridCache(self.text_config)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.model.model.get_image_features(
            pixel_values=inputs["pixel_values"].to(device=self.device, dtype=self.dtype),
            spatial_shapes=inputs["spatial_shapes"].to(device=self.device, dtype=torch.long),
            pixel_attention_mask=inputs["pixel_attention_mask"].to(device=self.device, dtype=torch.bool),
        )
        return feature_rows(out)  # [sum of (h / factor) * (w / factor), hidden]

    def image_pieces(self, inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return first_dim_pieces(inputs)  # one per tile (the tower sees each tile alone, with its own mask and shape)

    def attention_mask(self, step: StepInputs) -> dict[str, torch.Tensor | None]:
        return {"full_attention": self.causal_mask(step.mask, step.token_ids.shape[1]), "conv": recurrent_mask(step)}
