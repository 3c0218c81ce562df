"""LLaVA (LlavaForConditionalGeneration): one image -> one contiguous run of image tokens."""

from __future__ import annotations

from typing import Any

import torch

from engine.models.base import ModelFamily, SquareImages, feature_rows, first_dim_pieces
from splice.errors import FailedPrecondition


def llava_images(config: Any) -> SquareImages:
    """The patches of each image, less the CLS position for the "default" strategy ("full" keeps it)."""
    if not isinstance(config.vision_feature_layer, int):
        raise FailedPrecondition("llava with several vision_feature_layer values is not supported")
    vc = config.vision_config
    cls_row = 1 if config.vision_feature_select_strategy == "full" else 0
    return SquareImages(vc.num_channels, vc.image_size, (vc.image_size // vc.patch_size) ** 2 + cls_row)


class Llava(ModelFamily):
    name = "llava"

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.images = llava_images(self.config)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        return feature_rows(self.model.get_image_features(pixel_values=pv))  # [images * rows_per_image, hidden]

    def image_pieces(self, inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return first_dim_pieces(inputs)  # one per image
