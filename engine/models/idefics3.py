"""Idefics3 and SmolVLM (Idefics3/SmolVLMForConditionalGeneration): images split into tiles plus a global
view, each tile's rows between tags, so one image makes several non-contiguous image-token runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.models.base import ImageGeometry, ModelFamily, check_float, check_names, feature_rows
from splice.errors import InvalidArgument


@dataclass(frozen=True)
class Idefics3Images(ImageGeometry):
    """[batch, tiles, channels, side, side] pixels -> rows per real tile. All-zero tiles are batch padding
    and make no rows, exactly as the HF model drops them."""

    channels: int
    image_size: int
    patch_size: int
    scale_factor: int

    @classmethod
    def from_config(cls, config: Any) -> Idefics3Images:
        vc = config.vision_config
        return cls(vc.num_channels, vc.image_size, vc.patch_size, config.scale_factor)

    @property
    def rows_per_tile(self) -> int:
        return (self.image_size // self.patch_size) ** 2 // self.scale_factor**2

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        check_names(inputs, ("pixel_values", "pixel_attention_mask"), ("pixel_values",))
        pv = inputs["pixel_values"]  # [batch, tiles, channels, height, width]
        want = (self.channels, self.image_size, self.image_size)
        if pv.dim() != 5 or tuple(pv.shape[2:]) != want:
            raise InvalidArgument(
                f"pixel_values: shape {list(pv.shape)}, expected [batch, tiles, {', '.join(map(str, want))}]")
        check_float("pixel_values", pv)
        mask = inputs.get("pixel_attention_mask")
        if mask is not None and tuple(mask.shape) != (*pv.shape[:2], *pv.shape[3:]):
            raise InvalidArgument(f"pixel_attention_mask: shape {list(mask.shape)}, expected "
                                  f"{[*pv.shape[:2], *pv.shape[3:]]} (pixel_values without channels)")
        real_tiles = int((pv.flatten(2) != 0).any(dim=-1).sum())
        return real_tiles * self.rows_per_tile


class Idefics3(ModelFamily):
    name = "idefics3"

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.images = Idefics3Images.from_config(self.config)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        mask = inputs.get("pixel_attention_mask")
        if mask is not None:
            mask = mask.to(device=self.device, dtype=torch.bool)
        out = self.model.model.get_image_features(pixel_values=pv, pixel_attention_mask=mask)
        return feature_rows(out)  # [real_tiles * rows_per_tile, hidden]

    def image_pieces(self, inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """One piece per real tile ([1, 1, channels, side, side], with its mask): the tower and the connector
        see each tile alone, and the tiles of an image are not marked apart in pixel_values."""
        pv, mask = inputs["pixel_values"], inputs.get("pixel_attention_mask")
        real = (pv.flatten(2) != 0).any(dim=-1)  # [batch, tiles]; all-zero tiles are padding (as HF drops them)
        pieces = []
        for b, t in real.nonzero().tolist():
            piece = {"pixel_values": pv[b, t][None, None]}
            if mask is not None:
                piece["pixel_attention_mask"] = mask[b, t][None, None]
            pieces.append(piece)
        return pieces
