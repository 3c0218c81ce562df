"""Qwen3.5 (Qwen3_5ForConditionalGeneration): gated delta-net linear-attention layers between full attention
layers (engine/models/hybrid_cache.py), M-RoPE positions, a vision tower whose patches are merged 2x2.

M-RoPE: text positions advance by one on all three axes (time, height, width); an image's merged tokens take
(t, row, col) offsets from the position where the image starts, and the text after it resumes at that start +
max(grid_h, grid_w) / merge. Decode positions continue from max + 1. (Qwen2-VL's rule is the same; this copy is
to be shared with engine/models/qwen2_vl.py once both are merged.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.models.base import ModelFamily, StepInputs, check_float, check_names, feature_rows
from engine.models.hybrid_cache import HybridCache, recurrent_mask
from splice.errors import InvalidArgument


@dataclass(frozen=True)
class QwenVisionImages:
    """pixel_values [patches, channels * temporal_patch * patch * patch] and image_grid_thw [images, 3] (patch
    counts in time, height, width) -> t * h * w / merge^2 feature rows per image."""

    channels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int

    @classmethod
    def from_config(cls, config: Any) -> QwenVisionImages:
        vc = config.vision_config
        return cls(vc.in_channels, vc.patch_size, vc.temporal_patch_size, vc.spatial_merge_size)

    @property
    def patch_width(self) -> int:
        return self.channels * self.temporal_patch_size * self.patch_size**2

    def rows_per_image(self, grid: torch.Tensor) -> list[int]:
        return (grid.prod(-1) // self.merge_size**2).tolist()

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        check_names(inputs, ("pixel_values", "image_grid_thw"), ("pixel_values", "image_grid_thw"))
        pv, grid = inputs["pixel_values"], inputs["image_grid_thw"]
        if grid.dim() != 2 or grid.shape[1] != 3 or grid.dtype.is_floating_point or grid.dtype == torch.bool:
            raise InvalidArgument(f"image_grid_thw: shape {list(grid.shape)} {grid.dtype}, expected [images, 3] "
                                  f"integers")
        if bool((grid <= 0).any()) or bool((grid[:, 1:] % self.merge_size != 0).any()):
            raise InvalidArgument(f"image_grid_thw: {grid.tolist()}; every count must be positive and height and "
                                  f"width multiples of {self.merge_size}")
        patches = int(grid.prod(-1).sum())
        if pv.dim() != 2 or tuple(pv.shape) != (patches, self.patch_width):
            raise InvalidArgument(f"pixel_values: shape {list(pv.shape)}, expected [{patches}, {self.patch_width}] "
                                  f"(patches of image_grid_thw, channels * {self.temporal_patch_size} * "
                                  f"{self.patch_size} * {self.patch_size})")
        check_float("pixel_values", pv)
        return sum(self.rows_per_image(grid))


def mrope_positions(image_mask: torch.Tensor, grid: torch.Tensor | None, merge: int) -> torch.Tensor:
    """image_mask [P] bool (image-token positions, images in order), grid [images, 3] -> [3, P] position ids."""
    out = torch.empty(3, len(image_mask), dtype=torch.long, device=image_mask.device)
    sizes = [] if grid is None else [(int(t), int(h) // merge, int(w) // merge) for t, h, w in grid.tolist()]
    images = iter(sizes)
    pos = i = 0
    while i < len(image_mask):
        if not image_mask[i]:
            out[:, i] = pos
            pos += 1
            i += 1
            continue
        t, h, w = next(images)
        n = t * h * w
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
        out[:, i:i + n] = torch.stack([tt, hh, ww]).reshape(3, n).to(out.device) + pos
        pos += max(h, w)
        i += n
    return out


class Qwen3_5(ModelFamily):
    name = "qwen3_5"
    model_types: ClassVar[tuple[str, ...]] = ("qwen3_5",)
    position_dims = 3

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.images = QwenVisionImages.from_config(self.config)
        self.cache = HybridCache(self.text_config)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        grid = inputs["image_grid_thw"].to(device=self.device, dtype=torch.long)
        return feature_rows(self.model.model.get_image_features(pixel_values=pv, image_grid_thw=grid))

    def prompt_positions(self, ids: torch.Tensor, image_mask: torch.Tensor,
                         inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return mrope_positions(image_mask, inputs.get("image_grid_thw"), self.images.merge_size)

    def attention_mask(self, step: StepInputs) -> dict[str, torch.Tensor | None]:
        return {"full_attention": self.causal_mask(step.mask, step.token_ids.shape[1]),
                "linear_attention": recurrent_mask(step)}
