"""Qwen2-VL and Qwen2.5-VL (Qwen2VL / Qwen2_5_VLForConditionalGeneration): images of any size as flat patch
rows with a (t, h, w) grid each, one contiguous run of image tokens per image, and 3-D M-RoPE positions.

An image's tokens share a temporal position and spread over its merged height x width grid, so the prompt's
largest position is usually smaller than its length: decode continues from max + 1 (Prompt.next_position),
which is HF's per-row rope delta. Span positions (prompt_embeds) are text positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.models.base import ImageGeometry, ModelFamily, check_float, check_names, feature_rows, grid_pieces
from splice.errors import InvalidArgument

INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@dataclass(frozen=True)
class Qwen2VLImages(ImageGeometry):
    """pixel_values [patches, channels * temporal_patch * patch * patch] with image_grid_thw [images, 3]:
    image i owns t*h*w patch rows and makes t*h*w / merge**2 feature rows."""

    beside_embeds: ClassVar[tuple[str, ...]] = ("image_grid_thw",)  # M-RoPE lays each image's rows on its grid
    channels: int
    temporal_patch_size: int
    patch_size: int
    merge_size: int

    @classmethod
    def from_config(cls, config: Any) -> Qwen2VLImages:
        vc = config.vision_config
        return cls(vc.in_channels, vc.temporal_patch_size, vc.patch_size, vc.spatial_merge_size)

    @property
    def patch_dim(self) -> int:
        return self.channels * self.temporal_patch_size * self.patch_size**2

    def rows_per_image(self, grid: torch.Tensor) -> list[int]:
        """grid [images, 3] (validated) -> feature rows of each image."""
        return [t * h * w // self.merge_size**2 for t, h, w in grid.tolist()]

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        check_names(inputs, ("pixel_values", "image_grid_thw"), ("pixel_values", "image_grid_thw"))
        grid = self._grid(inputs)
        pv = inputs["pixel_values"]  # [patches, patch_dim]
        patches = sum(t * h * w for t, h, w in grid.tolist())
        if pv.dim() != 2 or tuple(pv.shape) != (patches, self.patch_dim):
            raise InvalidArgument(f"pixel_values: shape {list(pv.shape)}, expected [{patches}, {self.patch_dim}] "
                                  f"(image_grid_thw's t*h*w patches of {self.channels}*{self.temporal_patch_size}*"
                                  f"{self.patch_size}*{self.patch_size} values)")
        check_float("pixel_values", pv)
        return sum(self.rows_per_image(grid))

    def embeds_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        return sum(self.rows_per_image(self._grid(inputs)))

    def _grid(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """image_grid_thw [images, 3], checked."""
        grid = inputs["image_grid_thw"]
        if grid.dim() != 2 or grid.shape[1] != 3 or grid.shape[0] == 0:
            raise InvalidArgument(f"image_grid_thw: shape {list(grid.shape)}, expected [images, 3] (t, h, w)")
        if grid.dtype not in INTEGER_DTYPES:
            raise InvalidArgument(f"image_grid_thw: dtype {str(grid.dtype).removeprefix('torch.')}, expected an "
                                  f"integer type")
        for i, (t, h, w) in enumerate(grid.tolist()):
            if t < 1 or h < 1 or w < 1 or h % self.merge_size or w % self.merge_size:
                raise InvalidArgument(f"image_grid_thw[{i}]: {[t, h, w]}, expected positive (t, h, w) with h and w "
                                      f"multiples of the merge size {self.merge_size}")
        return grid


class Qwen2VL(ModelFamily):
    name = "qwen2-vl"
    position_dims = 3  # M-RoPE: temporal, height, width

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.images = Qwen2VLImages.from_config(self.config)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        grid = inputs["image_grid_thw"].to(device=self.device, dtype=torch.long)
        return feature_rows(self.model.get_image_features(pixel_values=pv, image_grid_thw=grid))  # [rows, hidden]

    def image_pieces(self, inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return grid_pieces(inputs, "image_grid_thw")  # one per image

    def prompt_positions(self, ids: torch.Tensor, image_mask: torch.Tensor,
                         inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """[3, P]: HF's own get_rope_index, with the modality of each position taken from the image mask (never
        from a caller tensor): image positions on their image's grid, text and span positions 1-D after it."""
        if not bool(image_mask.any()):
            return torch.arange(len(ids), device=self.device)[None].expand(3, -1)
        grid = inputs["image_grid_thw"].to(device=self.device, dtype=torch.long)
        self._check_runs(image_mask, grid)
        positions, _ = self.model.model.get_rope_index(ids[None], mm_token_type_ids=image_mask[None].int(),
                                                        image_grid_thw=grid)
        return positions[:, 0]  # [3, P]

    def _check_runs(self, image_mask: torch.Tensor, grid: torch.Tensor) -> None:
        """One contiguous image-token run per image, in order: M-RoPE lays each run on its image's grid."""
        edge = image_mask.new_zeros(1).int()
        edges = torch.diff(image_mask.int(), prepend=edge, append=edge)  # +1 where a run starts, -1 after it ends
        starts, ends = (edges == 1).nonzero().flatten(), (edges == -1).nonzero().flatten()
        runs = (ends - starts).tolist()
        want = self.images.rows_per_image(grid)
        if runs != want:
            raise InvalidArgument(f"image tokens form runs of {runs} positions; image_grid_thw makes {want} "
                                  f"(one contiguous run per image, in order)")
