"""LLaVA (LlavaForConditionalGeneration): one image -> one contiguous run of image tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.models.base import ModelFamily, check_float, check_names, feature_rows
from splice.errors import FailedPrecondition, InvalidArgument


@dataclass(frozen=True)
class LlavaImages:
    """[images, channels, side, side] pixels -> patches (minus CLS for "default") rows per image."""

    channels: int
    image_size: int
    patch_size: int
    select_strategy: str  # "default" drops the CLS position, "full" keeps it

    @classmethod
    def from_config(cls, config: Any) -> LlavaImages:
        if not isinstance(config.vision_feature_layer, int):
            raise FailedPrecondition("llava with several vision_feature_layer values is not supported")
        vc = config.vision_config
        return cls(vc.num_channels, vc.image_size, vc.patch_size, config.vision_feature_select_strategy)

    @property
    def rows_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + (1 if self.select_strategy == "full" else 0)

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        check_names(inputs, ("pixel_values",), ("pixel_values",))
        pv = inputs["pixel_values"]  # [images, channels, height, width]
        want = (self.channels, self.image_size, self.image_size)
        if pv.dim() != 4 or tuple(pv.shape[1:]) != want:
            raise InvalidArgument(
                f"pixel_values: shape {list(pv.shape)}, expected [images, {', '.join(map(str, want))}]")
        check_float("pixel_values", pv)
        return pv.shape[0] * self.rows_per_image


class Llava(ModelFamily):
    name = "llava"
    model_types: ClassVar[tuple[str, ...]] = ("llava",)

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.images = LlavaImages.from_config(self.config)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        return feature_rows(self.model.get_image_features(pixel_values=pv))  # [images * rows_per_image, hidden]
